"""Commands typed into the Create form in a real Chromium (which submits textareas with CRLF line
endings) run as written: ``VAR=value \\`` continuations keep their variables, and the prefilled
example finds the DataStates drop-in on ``PYTHONPATH=$CHECKPOINT_VENDOR``."""

from __future__ import annotations

import pytest

from harness.browser import login

pytestmark = [pytest.mark.slow, pytest.mark.backend_neutral]

OWNER = ("form-cmd-owner", "owner-pass-1")


def log_text(console, job_id: int) -> str:
    status, page = console.api("GET", f"/api/v1/training-jobs/{job_id}/logs/?limit=500", user=OWNER[0])
    assert status == 200, (status, page)
    return "\n".join(line["text"] for line in page["lines"])


def create_through_the_form(page, console, name: str, command: str | None) -> int:
    page.goto(f"{console.base_url}/training-jobs/new/")
    page.fill("#id_name", name)
    if command is not None:
        page.fill("#id_command", command)
    page.click("button[type=submit]:has-text('Create Training Job')")
    page.wait_for_url("**/training-jobs/*/")
    return int(page.locator(".job-header").get_attribute("data-job-id"))


def test_a_multi_line_command_with_variable_prefixes_runs_with_the_variables_set(users, page):
    console = users
    login(page, console, *OWNER)
    command = (
        "GREETING=hello-from-the-form \\\n"
        "SECOND=two \\\n"
        "python -c \"import os; print('GREETING=' + os.environ.get('GREETING', 'unset'), 'SECOND=' + os.environ.get('SECOND', 'unset'))\""
    )
    job_id = create_through_the_form(page, console, "crlf-vars", command)
    job = console.wait_for_job(job_id, {"Completed", "Failed", "Pending - internalerror"}, timeout=90)
    text = log_text(console, job_id)
    assert job["status"] == "Completed", text
    assert "GREETING=hello-from-the-form SECOND=two" in text
    assert "command not found" not in text


def test_the_prefilled_example_imports_datastates_and_completes(users, page):
    console = users
    login(page, console, *OWNER)
    job_id = create_through_the_form(page, console, "prefilled-example", None)
    job = console.wait_for_job(job_id, {"Completed", "Failed", "Pending - internalerror"}, timeout=120)
    text = log_text(console, job_id)
    assert job["status"] == "Completed", text
    assert "DataStates checkpointing available: datastates.llm.DecoratedCheckpointing" in text
    assert "Training complete" in text
