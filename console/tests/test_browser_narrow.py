"""Phone-sized screens: at 360 px wide the list, detail and create pages never scroll sideways; the
list's rows become cards, the tabs scroll within themselves and the header folds into a menu.
Screenshots of each page are kept in test-artifacts/narrow-*.png."""
from __future__ import annotations

import pytest

from console.tests.browser import login, save_screenshot

pytestmark = pytest.mark.slow

OWNER = ("narrow-owner", "owner-pass-1")
WIDTH = 360


@pytest.fixture(scope="module")
def job(live_console):
    live_console.create_user(*OWNER)
    return live_console.create_job(
        OWNER[0], "a-rather-long-job-name-for-a-small-phone-screen",
        "python -c \"print('step 1/2 loss 0.5'); print('step 2/2 loss 0.25')\"",
        image="pytorch:2.13-py3.11", description="narrow screens",
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


def test_the_list_page_fits_360_px_with_rows_as_cards(live_console, job, phone):
    login(phone, live_console, *OWNER)
    phone.goto(f"{live_console.base_url}/")
    phone.wait_for_selector(f"tr[data-job-id='{job['id']}']")
    assert sideways_overflow(phone) == []
    row = phone.locator(f"tr[data-job-id='{job['id']}']")
    # A card: the row's cells stack, each within the screen.
    assert row.evaluate("tr => getComputedStyle(tr).display") != "table-row"
    assert row.locator("[data-field='image']").is_visible()
    save_screenshot(phone, "narrow-list", full_page=True)


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


def test_the_detail_page_fits_360_px_and_its_tabs_scroll(live_console, job, phone):
    live_console.wait_for_job(job["id"], "Completed", timeout=90)
    login(phone, live_console, *OWNER)
    phone.goto(f"{live_console.base_url}/training-jobs/{job['id']}/")
    phone.wait_for_selector(".live-state--on")
    assert sideways_overflow(phone) == []
    tabs = phone.locator(".tabs ul")
    assert tabs.evaluate("ul => getComputedStyle(ul).overflowX") in ("auto", "scroll")
    failover = phone.locator(".tabs a", has_text="Failover")
    failover.scroll_into_view_if_needed()
    assert failover.is_visible()
    save_screenshot(phone, "narrow-detail", full_page=True)
    for tab in ("logs", "checkpoints", "failover", "events"):
        phone.goto(f"{live_console.base_url}/training-jobs/{job['id']}/?tab={tab}")
        assert sideways_overflow(phone) == [], tab


def test_the_create_page_fits_360_px(live_console, job, phone):
    login(phone, live_console, *OWNER)
    phone.goto(f"{live_console.base_url}/training-jobs/new/")
    assert sideways_overflow(phone) == []
    save_screenshot(phone, "narrow-create", full_page=True)
