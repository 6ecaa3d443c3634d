"""tqdm's cursor-up (``ESC[A``) and colour codes never show in the log viewer as a box and "[A":
the viewer shows a line as ``logs.terminal.plain_text`` does, live and in search results."""

from __future__ import annotations

import pytest

from harness.browser import login

pytestmark = [pytest.mark.slow, pytest.mark.backend_neutral]

OWNER = ("log-terminal-owner", "owner-pass-1")
PRINTS = """python -c "print(chr(27) + '[A' + 'eval bar moved up'); print(chr(27) + '[31m' + 'red words' + chr(27) + '[0m')" """


def test_the_viewer_shows_terminal_lines_without_their_control_sequences(users, page):
    login(page, users, *OWNER)
    job = users.create_job(OWNER[0], "terminal-text", PRINTS.strip())
    users.wait_for_job(job["id"], {"Completed"}, timeout=300)
    page.goto(f"{users.base_url}/training-jobs/{job['id']}/?tab=logs")
    texts = page.locator("[data-log-viewer] .lv-text")
    page.get_by_text("red words").wait_for()
    shown = texts.all_inner_texts()
    assert "eval bar moved up" in shown and "red words" in shown, shown
    assert not any("\x1b" in t or "[A" in t or "[31m" in t for t in shown), shown
    assert page.js_errors == []
