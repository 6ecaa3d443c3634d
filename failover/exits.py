"""How a run stopped, in words: an exit code or a signal as ``failover.classify`` reports it (stdlib only)."""

from __future__ import annotations

import signal as _signal
from typing import Any


def signal_name(number: int) -> str:
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def exit_status_facts(exit_code: int | None, exit_signal: int | None) -> dict[str, Any]:
    facts: dict[str, Any] = {"exit_code": exit_code, "exit_signal": exit_signal}
    signal_number = exit_signal
    if signal_number is None and exit_code is not None:
        if exit_code < 0:
            signal_number = -exit_code
        elif exit_code > 128:
            signal_number = exit_code - 128
    if signal_number:
        name = signal_name(signal_number)
        facts["reason"] = {
            9: "killed by SIGKILL (host OOM kill?)",
            6: "aborted (SIGABRT)",
            11: "segmentation fault (SIGSEGV)",
            15: "terminated (SIGTERM)",
        }.get(signal_number, f"killed by {name}")
    elif exit_code is not None:
        facts["reason"] = "exited 0 (no failure)" if exit_code == 0 else f"exit code {exit_code}"
    return facts
