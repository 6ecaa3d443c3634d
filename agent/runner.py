"""The supervisor of one training process on a node: ``python -m agent.runner SPEC``.

Standard library only, no Django: the node agent starts it detached (its own session), so a
restart of the console or the agent does not touch the training run. It

1. starts the command with ``bash -c`` in a new process group, inside the sandbox the spec
   describes (``agent.sandbox``; without one only where an operator turned it off), and records
   that group in ``pid.json`` (the agent signals the run's processes through it);
2. captures stdout and stderr merged, line by line and in order, as JSON lines
   ``{"n": line number, "t": unix time, "s": text}`` in ``output.jsonl``: invalid UTF-8 is
   replaced, carriage-return progress bars collapse to their last state, a line longer than the
   limit is cut with a visible marker;
3. writes ``exit.json`` (exit code or signal) atomically once the output is complete.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agent.sandbox import wrap

CUT_MARKER = " …[line cut at {limit} characters]"


def clean_line(raw: bytes, limit: int) -> str:
    text = raw.rstrip(b"\n").decode("utf-8", errors="replace")
    if text.endswith("\r"):
        text = text[:-1]
    if "\r" in text:
        # A progress bar redraws itself with \r: keep what the terminal would show last.
        parts = [p for p in text.split("\r") if p]
        text = parts[-1] if parts else ""
    if len(text) > limit:
        text = text[:limit] + CUT_MARKER.format(limit=limit)
    return text


def write_json_atomic(path: Path, payload: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(payload, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def run(spec_path: Path) -> int:
    spec = json.loads(spec_path.read_text())
    run_dir = spec_path.parent
    limit = int(spec.get("max_line_chars", 16384))
    Path(spec["cwd"]).mkdir(parents=True, exist_ok=True)
    argv = ["bash", "-c", spec["command"]]
    if spec.get("sandbox"):
        argv = wrap(argv, policy=spec["sandbox"], cwd=spec["cwd"], run_dir=str(run_dir))
    proc = subprocess.Popen(
        argv,
        cwd=spec["cwd"],
        env=spec["env"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    write_json_atomic(run_dir / "pid.json", {"runner_pid": os.getpid(), "pgid": proc.pid, "started_at": time.time()})
    count = 0
    assert proc.stdout is not None
    with open(run_dir / "output.jsonl", "ab", buffering=0) as out:
        for raw in iter(proc.stdout.readline, b""):
            count += 1
            record = {"n": count, "t": time.time(), "s": clean_line(raw, limit)}
            out.write(json.dumps(record, ensure_ascii=False).encode("utf-8") + b"\n")
    code = proc.wait()
    if spec.get("sandbox") and 128 < code < 128 + 65:
        # bwrap reports a command killed by signal N as exit status 128 + N, as shells do.
        code = -(code - 128)
    write_json_atomic(
        run_dir / "exit.json",
        {
            "exit_code": code if code >= 0 else None,
            "signal": -code if code < 0 else None,
            "ended_at": time.time(),
            "lines": count,
        },
    )
    return 0


def main() -> int:
    # The run outlives whoever started us: a console restart's SIGHUP/SIGINT must not stop it.
    for sig in (signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    return run(Path(sys.argv[1]))


if __name__ == "__main__":
    sys.exit(main())


def kill_unfinished_runs(work_root: Path) -> int:
    """SIGKILL every run under ``work_root`` whose supervisor still lives (tests and benchmarks
    clean up with it: runs sit in their own sessions and outlive whoever started them).

    A run counts only while its supervisor's pid is still a ``agent.runner`` process, so a
    pid reused by the system is never hit. Returns how many runs were killed.
    """
    killed = 0
    for pid_file in Path(work_root).glob("**/rank-*/pid.json"):
        if (pid_file.parent / "exit.json").exists():
            continue
        try:
            info = json.loads(pid_file.read_text())
            runner_pid, pgid = int(info["runner_pid"]), int(info["pgid"])
            cmdline = Path(f"/proc/{runner_pid}/cmdline").read_bytes()
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if b"agent.runner" not in cmdline:
            continue
        for kill, target in ((os.killpg, pgid), (os.kill, runner_pid)):
            try:
                kill(target, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        killed += 1
    return killed
