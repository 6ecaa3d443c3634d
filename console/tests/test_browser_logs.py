"""The Logs tab in a real Chromium against a real console: live lines, failover banners, a
100,000-line log, search, line links, the no-JavaScript fallback and access rules."""

from __future__ import annotations

import re

import pytest

from harness.browser import login, pass_log_sockets_through, save_screenshot

pytestmark = pytest.mark.slow

OWNER = ("log-owner", "owner-pass-1")
OUTSIDER = ("log-outsider", "outsider-pass-1")


# Prints a start-up line, then numbered lines of its attempt; `lines` of them, or forever (None).
def counter(lines: int | None, pause: float) -> str:
    loop = f"for i in range({lines}):" if lines is not None else "i = 0\nwhile True:"
    step = "" if lines is not None else "; i += 1"
    return (
        'python -c "import os, time\n'
        "print('Starting dataset initialization', flush=True)\n"
        f"{loop}\n"
        f"    print('attempt', os.environ['JOB_ATTEMPT'], 'step', i, flush=True){step}; time.sleep({pause})\""
    )


@pytest.fixture(scope="module")
def big_log(users):
    """A finished job with a 100,000-line log (one line of its own, then lines inserted directly)."""
    job = users.create_job(OWNER[0], "big-log", "python -c \"print('done', flush=True)\"")
    users.wait_for_job(job["id"], "Completed")
    first, last = users.insert_log_lines(job["id"], 100_000)
    return {"id": job["id"], "first": first, "last": last}


def log_url(console, job_id: int, suffix: str = "") -> str:
    return f"{console.base_url}/training-jobs/{job_id}/?tab=logs{suffix}"


def rows(page):
    return page.locator("[data-log-viewer] .lv-row")


def row(page, seq: int):
    return page.locator(f'[data-log-viewer] .lv-row[data-seq="{seq}"]')


def line(page, text: str):
    """The row whose text is exactly ``text``."""
    return page.locator("[data-log-viewer] .lv-row", has=page.locator(".lv-text", has_text=re.compile(f"^{re.escape(text)}$")))


def rendered_seqs(page) -> list[int]:
    return page.eval_on_selector_all("[data-log-viewer] .lv-row", "rows => rows.map(r => +r.dataset.seq)")


def visible_seqs(page) -> list[int]:
    """The seqs of rows inside the viewport's visible box."""
    return page.eval_on_selector(
        "[data-lv-viewport]",
        """vp => { const box = vp.getBoundingClientRect();
                  return [...vp.querySelectorAll('.lv-row')].filter(r => { const b = r.getBoundingClientRect();
                      return b.bottom > box.top && b.top < box.bottom; }).map(r => +r.dataset.seq); }""",
    )


def status_of(page) -> str:
    return page.locator("[data-lv-status]").get_attribute("data-state") or ""


def test_a_running_job_shows_its_lines_live_without_a_reload(users, page):
    login(page, users, *OWNER)
    job = users.create_job(OWNER[0], "live-lines", counter(40, 0.05))
    page.goto(log_url(users, job["id"]))
    viewer = page.locator("[data-log-viewer]")
    assert viewer.is_visible()
    assert page.locator("[data-lv-fallback]").count() == 0

    page.get_by_text("Starting dataset initialization").wait_for()
    line(page, "attempt 1 step 39").wait_for(timeout=30_000)
    page.locator('[data-lv-status][data-state="ended"]').wait_for(timeout=30_000)
    assert "Ended" in page.locator("[data-lv-status]").inner_text()
    seqs = rendered_seqs(page)
    assert seqs == sorted(set(seqs)), "no duplicate or out-of-order lines"
    assert seqs[-1] - seqs[0] + 1 == len(seqs), "no gap"
    assert page.locator("[data-lv-status]").get_attribute("aria-live") == "polite"
    assert page.js_errors == []


def test_the_viewer_reconnects_after_a_lost_connection_without_gaps_or_duplicates(users, page):
    sockets = pass_log_sockets_through(page)
    login(page, users, *OWNER)
    job = users.create_job(OWNER[0], "reconnects", counter(None, 0.05))
    page.goto(log_url(users, job["id"]))
    line(page, "attempt 1 step 5").wait_for(timeout=30_000)
    sockets[0].close(code=1011, reason="connection lost in the test")
    page.locator('[data-lv-status][data-state="reconnecting"]').wait_for()
    page.locator('[data-lv-status][data-state="following"]').wait_for(timeout=30_000)
    assert len(sockets) == 2
    assert re.search(r"[?&]after=[1-9][0-9]*", sockets[1].url), "the new socket resumes from the last line"
    newest = max(rendered_seqs(page))
    page.wait_for_function(f"() => !!document.querySelector('.lv-row[data-seq=\"{newest + 20}\"]')")
    users.api("POST", f"/api/v1/training-jobs/{job['id']}/stop/", user=OWNER[0])
    page.locator('[data-lv-status][data-state="ended"]').wait_for(timeout=30_000)
    # Every line of the stream arrived once, in order: the viewer's lines are REST's.
    status, body = users.api("GET", f"/api/v1/training-jobs/{job['id']}/logs/?after=0&limit=5000", user=OWNER[0])
    assert status == 200
    expected = [line["seq"] for line in body["lines"]]
    loaded = page.evaluate("() => document.querySelector('[data-log-viewer]').logViewer.loadedSeqs()")
    assert loaded == expected


def test_a_failover_shows_a_banner_between_attempts_and_the_start_up_line_twice(users, page):
    login(page, users, *OWNER)
    job = users.create_job(OWNER[0], "fails-over", counter(None, 0.1))
    job_id = job["id"]
    page.goto(log_url(users, job_id))
    line(page, "attempt 1 step 3").wait_for(timeout=30_000)

    placement = users.attempts(job_id)[0]["placements"][0]
    users.inject_fault(placement["node"], gpu=placement["gpu_indices"][0], xid=79)
    line(page, "attempt 2 step 2").wait_for(timeout=60_000)
    users.api("POST", f"/api/v1/training-jobs/{job_id}/stop/", user=OWNER[0])

    # Search finds the start-up line twice: once per attempt.
    page.fill("[data-lv-query]", "Starting dataset initialization")
    page.press("[data-lv-query]", "Enter")
    results = page.locator("[data-lv-results-list] a")
    results.nth(1).wait_for()
    assert results.count() == 2
    results.nth(1).click()

    banner = page.locator('[data-log-viewer] .lv-banner[role="note"]')
    banner.wait_for()
    assert "attempt 2" in banner.inner_text()
    assert "Xid 79" in banner.inner_text()
    before = banner.locator("xpath=preceding-sibling::div[1]")
    after = banner.locator("xpath=following-sibling::div[1]")
    assert before.get_attribute("data-attempt") == "1"
    assert after.get_attribute("data-attempt") == "2"
    # Each attempt's log opens with its container being prepared, then the job's own lines.
    assert after.inner_text().split("\n")[-1].startswith(("[console] pull: ", "[console] image "))
    target = page.locator("[data-log-viewer] .is-target")
    assert target.get_attribute("data-attempt") == "2"
    assert "Starting dataset initialization" in target.inner_text()
    # The banner is set apart from the job's output.
    colours = banner.evaluate("b => [getComputedStyle(b).backgroundColor, getComputedStyle(b.nextElementSibling).backgroundColor]")
    assert colours[0] != colours[1]
    save_screenshot(page, "log-tab-failover")

    # Filtering by attempt 2 shows only that attempt's lines.
    page.select_option("[data-lv-attempt]", "2")
    page.wait_for_function("() => [...document.querySelectorAll('.lv-row')].every(r => r.dataset.attempt === '2')")
    assert page.locator(".lv-banner").count() == 0


def test_a_100000_line_log_scrolls_to_the_top_and_back_with_a_small_dom(users, big_log, page):
    login(page, users, *OWNER)
    page.goto(log_url(users, big_log["id"]))
    row(page, big_log["last"]).wait_for()
    assert big_log["last"] in visible_seqs(page)
    assert rows(page).count() < 500

    # Scrolling up past the loaded lines fetches the page before them.
    lowest = min(rendered_seqs(page))
    viewport = page.locator("[data-lv-viewport]")
    viewport.evaluate("vp => { vp.scrollTop = 0; }")
    page.wait_for_function(f"() => Math.min(...[...document.querySelectorAll('.lv-row')].map(r => +r.dataset.seq)) < {lowest - 500}")
    assert rows(page).count() < 500

    # Top loads the first lines.
    page.click("[data-lv-top]")
    row(page, 1).wait_for()
    assert 1 in visible_seqs(page)
    assert rows(page).count() < 500

    # Scroll down through several pages: rows keep rendering in order.
    viewport.hover()
    for _ in range(30):
        page.mouse.wheel(0, 2000)
    page.wait_for_function("() => document.querySelector('.lv-row') && +document.querySelector('.lv-row').dataset.seq > 1000")
    seen = visible_seqs(page)
    assert seen and seen == list(range(seen[0], seen[0] + len(seen)))
    assert rows(page).count() < 500

    # End (from the keyboard) returns to the newest lines.
    viewport.focus()
    page.keyboard.press("End")
    page.wait_for_function(f"() => !!document.querySelector('.lv-row[data-seq=\"{big_log['last']}\"]')")
    page.wait_for_timeout(200)
    assert big_log["last"] in visible_seqs(page)
    assert rows(page).count() < 500
    assert status_of(page) == "ended"
    save_screenshot(page, "log-tab-100k")

    # Wrapped lines still render a window of rows.
    page.check("[data-lv-wrap]")
    page.wait_for_timeout(300)
    assert big_log["last"] in visible_seqs(page)
    assert rows(page).count() < 500
    page.click("[data-lv-top]")
    row(page, 1).wait_for()
    assert 1 in visible_seqs(page)
    page.uncheck("[data-lv-wrap]")
    assert page.js_errors == []


def test_search_highlights_a_match_anywhere_in_the_log(users, big_log, page):
    login(page, users, *OWNER)
    page.goto(log_url(users, big_log["id"]))
    row(page, big_log["last"]).wait_for()
    page.get_by_label("Search the whole log").fill("line 54321 of")
    page.get_by_role("button", name="Search", exact=True).click()
    page.locator("[data-lv-results-list] a").first.wait_for()
    assert re.search(r"\b1 line contains", page.locator("[data-lv-results-summary]").inner_text())
    target = row(page, 54321)
    target.wait_for()
    assert target.locator("mark").inner_text().lower() == "line 54321 of"
    assert "is-target" in (target.get_attribute("class") or "")
    assert 54321 in visible_seqs(page)
    save_screenshot(page, "log-tab-search")


def test_a_line_link_opens_the_log_around_that_line_highlighted(users, big_log, page):
    login(page, users, *OWNER)
    page.goto(log_url(users, big_log["id"], "#L12345"))
    target = row(page, 12345)
    target.wait_for()
    assert "is-target" in (target.get_attribute("class") or "")
    assert 12345 in visible_seqs(page)
    assert status_of(page) in {"paused", "ended"}
    # A line number is itself a link to its line.
    assert target.locator("a.lv-num").get_attribute("href") == "#L12345"


def test_without_javascript_the_tab_shows_the_last_lines(users, big_log, browser):
    context = browser.new_context(java_script_enabled=False)
    try:
        tab = context.new_page()
        login(tab, users, *OWNER)
        tab.goto(log_url(users, big_log["id"]))
        items = tab.locator("#log li")
        assert items.count() == 1000
        assert items.last.get_attribute("data-seq") == str(big_log["last"])
        assert "Showing the last 1000 lines" in tab.content()
        assert tab.locator("[data-log-viewer]").is_hidden()
    finally:
        context.close()


def test_an_outsider_cannot_open_the_job(users, big_log, page):
    login(page, users, *OUTSIDER)
    response = page.goto(log_url(users, big_log["id"]))
    assert response.status == 404
    assert "big-log" not in page.content()
    api = page.request.get(f"{users.base_url}/api/v1/training-jobs/{big_log['id']}/logs/")
    assert api.status == 404
