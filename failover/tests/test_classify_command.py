"""``manage.py classify_failure``: one JSON case on stdin, one JSON verdict on stdout."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_command(monkeypatch, stdin_text: str) -> dict:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin_text))
    out = io.StringIO()
    call_command("classify_failure", stdout=out)
    return json.loads(out.getvalue())


def test_it_judges_a_kernel_xid_79_as_hardware(monkeypatch):
    case = {
        "exit_code": 1,
        "log": "step 10\nRuntimeError: CUDA error: unknown error",
        "kernel_log": "[5.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=7, GPU has fallen off the bus.",
    }

    result = run_command(monkeypatch, json.dumps(case))

    assert result["verdict"] == "hardware"
    assert result["reason"] == "Xid 79 on PCI 0000:3b:00: GPU has fallen off the bus"
    assert result["evidence"]["xid"] == 79
    assert result["evidence"]["exit_code"] == 1


def test_it_judges_a_missing_module_as_non_hardware(monkeypatch):
    case = {"exit_code": 1, "log": ["Traceback (most recent call last):", "ModuleNotFoundError: No module named 'foo'"]}

    result = run_command(monkeypatch, json.dumps(case))

    assert result == {
        "verdict": "non-hardware",
        "reason": "ModuleNotFoundError: No module named 'foo'",
        "evidence": {"source": "log", "signature": "import_error", "matched": "ModuleNotFoundError: No module named 'foo'", "exit_code": 1},
    }


def test_it_accepts_findings_and_exit_signal(monkeypatch):
    case = {"exit_signal": 9, "findings": [{"kind": "gpu_count", "value": 3, "expected": 4}]}

    result = run_command(monkeypatch, json.dumps(case))

    assert result["verdict"] == "hardware"
    assert result["reason"] == "Only 3 of 4 GPUs visible"
    assert result["evidence"]["exit_signal"] == 9


def test_every_field_is_optional(monkeypatch):
    assert run_command(monkeypatch, "{}") == {"verdict": "non-hardware", "reason": "no hardware fault signal", "evidence": {"source": "none"}}


@pytest.mark.parametrize(
    ("stdin_text", "message"),
    [
        ("not json", "input is not valid JSON"),
        ("[1, 2]", "input must be a JSON object"),
        ('{"exit_code": "1"}', '"exit_code" must be an integer or null'),
        ('{"exit_code": true}', '"exit_code" must be an integer or null'),
        ('{"exit_signal": 9.5}', '"exit_signal" must be an integer or null'),
        ('{"log": 42}', '"log" must be a string or a list of strings'),
        ('{"kernel_log": ["a"]}', '"kernel_log" must be a string'),
        ('{"findings": {"kind": "xid"}}', '"findings" must be a list of objects'),
        ('{"findings": [{"kind": "bogus"}]}', 'findings[0]: "kind" must be one of'),
        ('{"findings": [{"kind": "xid", "xid": "79"}]}', 'findings[0]: "xid" must be an integer or null'),
        ('{"findings": [{"kind": "xid", "colour": 1}]}', "findings[0]: unknown field(s): colour"),
        ('{"exitcode": 1}', "unknown field(s): exitcode"),
    ],
)
def test_bad_input_is_refused_with_exit_status_2(monkeypatch, stdin_text, message):
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin_text))

    with pytest.raises(CommandError) as excinfo:
        call_command("classify_failure", stdout=io.StringIO())

    assert excinfo.value.returncode == 2
    assert message in str(excinfo.value)


def _manage(stdin_text: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", "classify_failure"],
        check=False,
        input=stdin_text,
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
    )


@pytest.mark.slow  # a manage.py process
def test_from_the_shell_it_prints_one_json_line():
    result = _manage(json.dumps({"exit_code": 137}))

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "verdict": "non-hardware",
        "reason": "killed by SIGKILL (host OOM kill?)",
        "evidence": {"source": "exit", "exit_code": 137},
    }


@pytest.mark.slow  # a manage.py process
def test_from_the_shell_bad_json_exits_2_with_a_message_and_no_traceback():
    result = _manage("{oops")

    assert result.returncode == 2
    assert "input is not valid JSON" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
