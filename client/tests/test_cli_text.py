"""What ``satrain`` prints of a job (its name, description, command, env, status reason, events'
reasons, the API's messages, nodes' reasons) is text: Rich markup in it is printed as written (a
``[/nope]`` does not end the command), and its control characters are shown as ``\\xNN`` escapes,
never sent to the terminal. No console is needed: the API client is a stand-in."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest

pytest.importorskip("satrain", reason="the client is not installed: pip install -e ./client")

from rich.console import Console
from typer.testing import CliRunner

from satrain import cli
from satrain.api import ApiError

# Markup Rich would read (a closing tag with no opening one is an error), an emoji code, terminal
# control sequences (a window title, a screen clear, a C1 CSI) and a carriage return.
HOSTILE = "[/nope] [bold]b[/bold] :smile: \x1b]0;pwned\x07 \x1b[2J \x9b31m over\rwritten"
SHOWN = "[/nope] [bold]b[/bold] :smile: \\x1b]0;pwned\\x07 \\x1b[2J \\x9b31m over\\x0dwritten"
CONTROLS = ("\x1b", "\x07", "\x9b", "\r")

JOB = {
    "id": 7,
    "name": "[red]n[/red]",
    "owner": "alice",
    "project_name": "alice",
    "status": "Failed",
    "status_reason": HOSTILE,
    "job_type": "On-Demand",
    "image": "img",
    "command": f"echo '{HOSTILE}'",
    "env": {"X": HOSTILE},
    "gpus_per_node": 1,
    "node_count": 1,
    "failover_enabled": True,
    "failover_attempts": "0/3",
    "output_dir": "",
    "max_run_minutes": None,
    "created_at": "2026-12-03T12:00:00Z",
    "started_at": None,
    "finished_at": None,
    "running_time_seconds": None,
    "description": f"multi\nline\t{HOSTILE}",
}
EVENTS = [{"created_at": "2026-12-03T12:00:00Z", "from_status": "Running", "to_status": "Failed", "attempt": 1, "actor": "system", "reason": HOSTILE}]
NODES = [
    {
        "name": "node-a",
        "state": "up",
        "healthy": False,
        "cordoned": False,
        "health_reason": HOSTILE,
        "gpus": [{"index": 0, "healthy": False, "allocated": False}],
    }
]


class FakeClient:
    def __init__(self, error: ApiError | None = None) -> None:
        self.error = error

    def answer(self, value: Any) -> Any:
        if self.error is not None:
            raise self.error
        return value

    def job(self, job_id: int) -> dict:
        return self.answer(JOB)

    def list_jobs(self, **filters: Any) -> list[dict]:
        return self.answer([JOB])

    def get(self, path: str, **params: Any) -> Any:
        return self.answer(EVENTS if path.endswith("/events/") else {"results": NODES})

    def post(self, path: str, body: Any = None) -> dict:
        return self.answer({**JOB, "id": 8})


@pytest.fixture
def run(monkeypatch):
    """Run ``satrain ARGS`` against a stand-in client; returns (exit code, stdout, stderr)."""

    def invoke(*args: str, error: ApiError | None = None, width: int = 400) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        monkeypatch.setattr(cli, "out", Console(file=out, width=width, soft_wrap=True))
        monkeypatch.setattr(cli, "err", Console(file=err, width=400))
        monkeypatch.setattr(cli, "client", lambda: FakeClient(error))
        result = CliRunner().invoke(cli.app, list(args))
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        return result.exit_code, out.getvalue() + result.stdout, err.getvalue()

    return invoke


def assert_text(printed: str) -> None:
    for control in CONTROLS:
        assert control not in printed


def test_jobs_get_prints_every_field_as_text(run):
    code, out, _ = run("jobs", "get", "7")
    assert code == 0
    assert_text(out)
    assert "[red]n[/red]" in out
    assert out.count(SHOWN) == 3  # the status reason, the command and the description
    assert re.search(r"multi *\n *line {2,}\[/nope\]", out)  # a description's newline and tab stay (in the table's column)
    assert "\\u001b]0;pwned\\u0007" in out  # env, as JSON


def test_jobs_list_and_events_print_names_and_reasons_as_text(run):
    code, out, _ = run("jobs", "list")
    assert code == 0
    assert_text(out)
    assert "[red]n[/red]" in out
    code, out, _ = run("jobs", "events", "7")
    assert code == 0
    assert_text(out)
    assert SHOWN in out


def test_messages_with_a_jobs_name_or_reason_are_text(run):
    for args in (("jobs", "create", "--name", "x"), ("jobs", "clone", "7"), ("jobs", "stop", "7")):
        code, out, _ = run(*args)
        assert code == 0, args
        assert_text(out)
    assert "[red]n[/red]" in run("jobs", "clone", "7")[1]
    code, out, err = run("jobs", "wait", "7")
    assert code == 3
    assert_text(err)
    assert SHOWN in err


def test_an_api_message_is_printed_as_text_with_exit_1(run):
    code, _, err = run("jobs", "get", "7", error=ApiError(400, f"name: {HOSTILE}"))
    assert code == 1
    assert_text(err)
    assert f"Error: name: {SHOWN}" in err


def test_nodes_reasons_are_text(run):
    code, out, _ = run("nodes", "list")
    assert code == 0
    assert_text(out)
    assert SHOWN in out


def test_json_output_escapes_del_and_c1_controls_too(run):
    code, out, _ = run("jobs", "get", "7", "-o", "json")
    assert code == 0
    assert_text(out)
    assert "\\u009b31m" in out
    assert json.loads(out) == JOB


def test_a_terminal_still_gets_the_clients_own_styles():
    printed = io.StringIO()
    console = Console(file=printed, force_terminal=True, color_system="standard", width=200)
    cli.say(console, HOSTILE, "bold")
    assert printed.getvalue().startswith("\x1b[1m")  # Rich's own bold
    assert SHOWN in printed.getvalue()
    assert "\x07" not in printed.getvalue() and "\x9b" not in printed.getvalue()


def test_a_masked_secret_reads_as_dots_and_events_fit_an_80_column_terminal(run, monkeypatch):
    monkeypatch.setitem(JOB, "env", {"HF_TOKEN": "••••", "NAME": "모델"})
    code, out, _ = run("jobs", "get", "7")
    assert code == 0 and '"HF_TOKEN": "••••"' in out and "모델" in out and "\\u2022" not in out
    monkeypatch.setattr(cli, "EVENTS_TABLE_MIN_WIDTH", 120)
    code, out, _ = run("jobs", "events", "7", width=80)
    assert code == 0 and out.splitlines()[0] == "2026-12-03 12:00:00  Running → Failed  (attempt 1, system)"
    assert out.splitlines()[1] == "    " + SHOWN and max(len(line) for line in out.splitlines()) <= 4 + len(SHOWN)
