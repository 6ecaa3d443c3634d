"""Phone-sized screens: at 360 px wide the list, detail, create and Nodes pages never scroll sideways
and cut nothing off: the list's rows become cards under a folded "Filters" disclosure, every tab of
a job shows in view, the tables of its tabs and the Nodes page's GPUs become labelled cards, and the
header folds into a menu. Screenshots of each page are kept in test-artifacts/narrow-*.png."""

from __future__ import annotations

import pytest

from harness.browser import login, save_screenshot

pytestmark = [pytest.mark.slow, pytest.mark.backend_neutral]

OWNER = ("narrow-owner", "owner-pass-1")
OPERATOR = ("narrow-operator", "operator-pass-1")
WIDTH = 360
# A job's tabs, as the detail page lists them (console/pages/jobs.py TABS, capitalised).
TABS = ("Details", "Logs", "Checkpoints", "Outputs", "Failover", "Events")


@pytest.fixture(scope="module")
def job(live_console):
    live_console.create_user(*OWNER)
    return live_console.create_job(
        OWNER[0],
        "a-rather-long-job-name-for-a-small-phone-screen",
        "python -c \"print('step 1/2 loss 0.5'); print('step 2/2 loss 0.25')\"",
        image="pytorch:2.13-py3.11",
        description="narrow screens",
    )


@pytest.fixture
def phone(page):
    page.set_viewport_size({"width": WIDTH, "height": 760})
    return page


def sideways_overflow(page) -> list[str]:
    """The page's horizontal overflow, and the widest elements that stick out, if any."""
    return page.evaluate(
        """(width) => {
        const doc = document.documentElement;
        if (doc.scrollWidth <= doc.clientWidth) { return []; }
        const out = [`document ${doc.scrollWidth}px > ${doc.clientWidth}px`];
        document.querySelectorAll("body *").forEach((el) => {
          const r = el.getBoundingClientRect();
          if (r.right > width + 1 && !el.closest(".table-scroll, .tabs ul, pre, .log")) {
            out.push(`${el.tagName.toLowerCase()}.${el.className} right=${Math.round(r.right)}`);
          }
        });
        return out.slice(0, 12);
    }""",
        WIDTH,
    )


def clipped(page, selector: str) -> list[str]:
    """What sticks out of the screen, or of an element that hides or scrolls its overflow, among
    ``selector`` and everything inside it that shows. Code, charts and the log viewer keep their
    own lines and scroll within themselves (the log has "Wrap lines"): they are not counted."""
    return page.evaluate(
        """([selector, width]) => {
        const out = [];
        document.querySelectorAll(selector).forEach((root) => {
          [root, ...root.querySelectorAll("*")].forEach((el) => {
            const r = el.getBoundingClientRect();
            if (r.width === 0 || r.height === 0 || el.closest(".visually-hidden, thead, caption, pre, .log, .lv-viewport, .uplot, svg, option")) { return; }
            const name = `${el.tagName.toLowerCase()}.${el.className} "${el.textContent.trim().slice(0, 30)}"`;
            if (r.left < -1 || r.right > width + 1) { out.push(`${name}: ${Math.round(r.left)}..${Math.round(r.right)}px`); }
            const style = getComputedStyle(el);
            if (style.overflowX !== "visible" && el.scrollWidth > el.clientWidth + 1) {
              out.push(`${name}: ${el.scrollWidth}px of content in ${el.clientWidth}px (overflow-x ${style.overflowX})`);
            }
            if (style.textOverflow === "ellipsis" && el.scrollWidth > el.clientWidth + 1) { out.push(`${name}: cut by an ellipsis`); }
          });
        });
        return out.slice(0, 12);
    }""",
        [selector, WIDTH],
    )


def test_the_list_page_fits_360_px_with_rows_as_cards(live_console, job, phone):
    login(phone, live_console, *OWNER)
    phone.goto(f"{live_console.base_url}/")
    phone.wait_for_selector(f"tr[data-job-id='{job['id']}']")
    assert sideways_overflow(phone) == []
    row = phone.locator(f"tr[data-job-id='{job['id']}']")
    # A card: the row's cells stack, each within the screen.
    assert row.evaluate("tr => getComputedStyle(tr).display") != "table-row"
    assert row.locator("[data-field='image']").is_visible()
    assert clipped(phone, ".jobs-table tbody") == []
    # The filters fold into a closed "Filters" disclosure, so the first job is near the top.
    search = phone.get_by_label("Search by name")
    assert not search.is_visible()
    first = phone.locator(".jobs-table tbody tr").first.bounding_box()
    assert first["y"] <= 250, f"the first job starts {first['y']:.0f} px down"
    # While a job holds GPUs the projects' quota usage shows too: after the jobs, whole.
    quota = phone.locator("[data-quota-usage]")
    if quota.count():
        assert quota.bounding_box()["y"] > first["y"]
        assert clipped(phone, "[data-quota-usage]") == []
    save_screenshot(phone, "narrow-list", full_page=True)

    phone.locator("summary", has_text="Filters").click()
    assert search.is_visible()
    assert phone.get_by_label("Status").is_visible()
    assert phone.get_by_role("button", name="Apply").is_visible()
    assert sideways_overflow(phone) == []
    assert clipped(phone, "form[role='search']") == []
    save_screenshot(phone, "narrow-list-filters-open")


def test_the_list_shows_its_filters_open_on_a_wide_screen(live_console, job, page):
    login(page, live_console, *OWNER)
    page.goto(f"{live_console.base_url}/")
    assert page.get_by_label("Search by name").is_visible()
    assert not page.locator("summary", has_text="Filters").is_visible()


def test_the_header_folds_into_a_menu_that_opens(live_console, job, phone):
    login(phone, live_console, *OWNER)
    phone.goto(f"{live_console.base_url}/")
    logout = phone.get_by_role("button", name="Log out")
    assert not logout.is_visible()
    phone.get_by_role("button", name="Menu").click()
    assert logout.is_visible()
    box = logout.bounding_box()
    assert box["x"] + box["width"] <= WIDTH
    assert sideways_overflow(phone) == []
    save_screenshot(phone, "narrow-menu-open")


def test_the_detail_page_fits_360_px_and_shows_every_tab(live_console, job, phone):
    live_console.wait_for_job(job["id"], "Completed", timeout=90)
    login(phone, live_console, *OWNER)
    phone.goto(f"{live_console.base_url}/training-jobs/{job['id']}/")
    phone.wait_for_selector(".live-state--on")
    assert sideways_overflow(phone) == []
    links = phone.locator(".tabs a")
    assert [text.strip() for text in links.all_inner_texts()] == list(TABS)
    # Every tab in view at once, none cut: no scrolling of the strip is needed to find one.
    for label in TABS:
        box = phone.locator(".tabs a", has_text=label).bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= WIDTH, (label, box)
    assert clipped(phone, ".tabs") == []
    for label in TABS:
        phone.locator(".tabs a", has_text=label).click()
        phone.wait_for_url(f"**/?tab={label.lower()}")
        panel = phone.locator(f".tab-panel[aria-label='{label}']")
        assert panel.is_visible(), label
        assert phone.locator(".tabs a[aria-current='page']").inner_text().strip() == label
        # The tab's own tables (attempts, checkpoints, events) become labelled cards.
        for cell in phone.locator(".tab-panel table.table tbody td").all():
            if cell.get_attribute("colspan") is None:
                assert cell.get_attribute("data-label"), (label, cell.inner_text())
        assert sideways_overflow(phone) == [], label
        assert clipped(phone, ".tab-panel") == [], label
        save_screenshot(phone, f"narrow-detail-{label.lower()}", full_page=True)
    # The card's label is drawn by CSS (::before). Read from the page as it is when read: the
    # socket's catch-up may re-render the tab's rows, and a replaced cell has no style (CI read '').
    phone.wait_for_function(
        "() => { const td = document.querySelector('.tab-panel table.table tbody tr td');"
        " return td !== null && getComputedStyle(td, '::before').content.includes('Time'); }",
        timeout=5_000,
    )


def test_the_log_wraps_its_lines_at_360_px_unless_the_user_chose_otherwise(live_console, job, phone):
    live_console.wait_for_job(job["id"], "Completed", timeout=90)
    login(phone, live_console, *OWNER)
    phone.evaluate("() => { localStorage.removeItem('logviewer.wrap'); localStorage.removeItem('logviewer.timestamps'); }")
    phone.goto(f"{live_console.base_url}/training-jobs/{job['id']}/?tab=logs")
    phone.wait_for_selector(".lv-row .lv-text")
    assert phone.locator("[data-lv-wrap]").is_checked()
    assert not phone.locator("[data-lv-timestamps]").is_checked()
    # Every line's text is shown whole inside the viewer: none runs past its right edge.
    cut = phone.evaluate(
        """() => {
        const view = document.querySelector(".lv-viewport").getBoundingClientRect();
        return [...document.querySelectorAll(".lv-row .lv-text")]
          .filter((t) => t.getBoundingClientRect().right > view.right + 1 || t.scrollWidth > t.clientWidth + 1)
          .map((t) => t.textContent.slice(0, 60));
        }"""
    )
    assert cut == []
    assert "step 2/2 loss 0.25" in phone.locator(".lv-rows").inner_text()
    save_screenshot(phone, "narrow-detail-logs-wrapped", full_page=True)
    # A choice the user made wins over the narrow default.
    phone.locator("[data-lv-wrap]").uncheck()
    phone.reload()
    phone.wait_for_selector(".lv-row .lv-text")
    assert not phone.locator("[data-lv-wrap]").is_checked()
    phone.evaluate("() => localStorage.removeItem('logviewer.wrap')")


def test_the_nodes_page_shows_every_gpu_column_at_360_px(live_console, job, phone):
    live_console.create_user(*OPERATOR, staff=True)
    holder = live_console.create_job(OWNER[0], "a-long-job-name-that-holds-a-gpu-on-a-phone", "sleep 300", image="pytorch:2.13-py3.11")
    try:
        live_console.wait_for_job(holder["id"], "Running", timeout=90)
        login(phone, live_console, *OPERATOR)
        phone.goto(f"{live_console.base_url}/nodes/")
        held = phone.locator("[data-field='held_by']", has_text=holder["name"])
        held.wait_for()
        assert sideways_overflow(phone) == []
        assert clipped(phone, "section[data-node]") == []
        # Each GPU a card of labelled fields, "Held by" with the whole job name in view.
        labels = held.locator("xpath=..").locator("td").evaluate_all("cells => cells.map(td => getComputedStyle(td, '::before').content.replace(/\"/g, ''))")
        assert labels == ["GPU", "Health", "Model", "Memory", "Held by"]
        box = held.locator("a").bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= WIDTH
        assert held.inner_text().startswith(holder["name"])
        held.scroll_into_view_if_needed()
        save_screenshot(phone, "narrow-nodes", full_page=True)
    finally:
        live_console.api("POST", f"/api/v1/training-jobs/{holder['id']}/stop/", user=OWNER[0])


def test_the_create_page_fits_360_px(live_console, job, phone):
    login(phone, live_console, *OWNER)
    phone.goto(f"{live_console.base_url}/training-jobs/new/")
    assert sideways_overflow(phone) == []
    save_screenshot(phone, "narrow-create", full_page=True)
