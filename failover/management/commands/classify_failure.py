"""``manage.py classify_failure``: judge one failure case read as JSON on stdin.

Input (every field optional)::

    {"exit_code": 1, "exit_signal": null, "log": "...", "kernel_log": "...",
     "findings": [{"kind": "xid", "xid": 79, "gpu": 2}]}

``log`` may be one string or a list of lines. Output, one JSON line on stdout::

    {"verdict": "hardware" | "non-hardware", "reason": "...", "evidence": {...}}

Bad JSON or wrong types: a message on stderr and exit status 2.
"""

from __future__ import annotations

import json
import sys

from django.core.management.base import BaseCommand, CommandError

from failover.classify import classify_failure
from failover.evidence import Finding, FindingKind

INPUT_FIELDS = ("exit_code", "exit_signal", "log", "kernel_log", "findings")
FINDING_INT_FIELDS = ("gpu", "xid", "value", "expected")


def _fail(message: str) -> CommandError:
    return CommandError(message, returncode=2)


def _optional_int(case: dict, key: str, where: str = "") -> int | None:
    value = case.get(key)
    # bool is an int in Python; true/false is never a valid exit code or index.
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise _fail(f'{where}"{key}" must be an integer or null, not {type(value).__name__}')


def _log_lines(case: dict) -> list[str]:
    log = case.get("log")
    if log is None:
        return []
    if isinstance(log, str):
        return log.splitlines()
    if isinstance(log, list) and all(isinstance(line, str) for line in log):
        return log
    raise _fail('"log" must be a string or a list of strings')


def _findings(case: dict) -> list[Finding]:
    raw = case.get("findings")
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _fail('"findings" must be a list of objects')
    findings = []
    for index, item in enumerate(raw):
        where = f"findings[{index}]: "
        if not isinstance(item, dict):
            raise _fail(f"{where}must be an object")
        unknown = sorted(set(item) - {"kind", "detail", *FINDING_INT_FIELDS})
        if unknown:
            raise _fail(f"{where}unknown field(s): {', '.join(unknown)}")
        kind = item.get("kind")
        if kind not in FindingKind.ALL:
            raise _fail(f'{where}"kind" must be one of {", ".join(FindingKind.ALL)}')
        for key in FINDING_INT_FIELDS:
            _optional_int(item, key, where)
        if not isinstance(item.get("detail", ""), str):
            raise _fail(f'{where}"detail" must be a string')
        findings.append(Finding.from_dict(item))
    return findings


def parse_case(text: str) -> dict:
    """The keyword arguments for ``classify_failure`` from one JSON case, or CommandError(2)."""
    try:
        case = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _fail(f"input is not valid JSON: {exc}") from None
    if not isinstance(case, dict):
        raise _fail("input must be a JSON object")
    unknown = sorted(set(case) - set(INPUT_FIELDS))
    if unknown:
        raise _fail(f"unknown field(s): {', '.join(unknown)} (expected: {', '.join(INPUT_FIELDS)})")
    kernel_log = case.get("kernel_log")
    if kernel_log is not None and not isinstance(kernel_log, str):
        raise _fail('"kernel_log" must be a string')
    return {
        "exit_code": _optional_int(case, "exit_code"),
        "exit_signal": _optional_int(case, "exit_signal"),
        "log_lines": _log_lines(case),
        "kernel_log": kernel_log or "",
        "findings": _findings(case),
    }


class Command(BaseCommand):
    help = "Classify one job failure (JSON on stdin) as hardware or non-hardware."

    def handle(self, *args, **options) -> None:
        kwargs = parse_case(sys.stdin.read())
        verdict = classify_failure(**kwargs)
        self.stdout.write(json.dumps(verdict.to_dict(), ensure_ascii=False))
