"""The green "Training Job … created. It is Pending." message follows the job's status live: when
the run fails and failover is refused, it reads "It is Pending - internalerror" in red, never
green above an error."""

from __future__ import annotations

import pytest

from harness.browser import login

pytestmark = [pytest.mark.slow, pytest.mark.backend_neutral]

OWNER = ("created-message-owner", "owner-pass-1")


def test_the_created_message_turns_red_when_the_job_fails(users, page):
    login(page, users, *OWNER)
    page.goto(f"{users.base_url}/training-jobs/new/")
    page.fill("#id_name", "fails-at-once")
    page.fill("#id_command", 'python -c "import sys; sys.exit(3)"')
    page.click("button[type=submit]:has-text('Create Training Job')")
    page.wait_for_url("**/training-jobs/*/")
    message = page.locator(".message", has_text="created")
    message.locator("[data-field=status_text]", has_text="Pending - internalerror").wait_for(timeout=120_000)
    assert message.get_attribute("class") == "message message--error"
    assert message.locator("use").get_attribute("href") == "#icon-alert"
    assert page.js_errors == []
