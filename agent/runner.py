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
3. writes ``exit.json`` (exit code or signal, and whether the kernel killed a process of the
   run for exceeding its memory limit) atomically once the output is complete.

Where the spec asks for ``limits``, the whole run (the sandbox and everything in it) starts in a
cgroup of its own with the run's CPU and memory limits (``agent.cgroups``), removed when the run
ends; where the node allows none, the run goes on without and its log's first line says so.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agent import cgroups
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
    limits = spec.get("limits")
    cgroup, unlimited = make_cgroup(limits) if limits is not None else ([], "")
    popen = dict(
        cwd=spec["cwd"],
        env=spec["env"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        # The child joins the cgroup before it runs anything: the whole sandbox starts inside.
        proc = subprocess.Popen(argv, preexec_fn=(lambda: cgroups.join_self(cgroup)) if cgroup else None, **popen)
    except subprocess.SubprocessError as exc:
        cgroups.remove([Path(d) for d in cgroup])
        cgroup, unlimited = [], f"could not join the run's cgroup ({exc})"
        proc = subprocess.Popen(argv, **popen)
    pid_info = {"runner_pid": os.getpid(), "pgid": proc.pid, "started_at": time.time(), "cgroup": cgroup}
    write_json_atomic(run_dir / "pid.json", pid_info)
    count = 0
    assert proc.stdout is not None
    with open(run_dir / "output.jsonl", "ab", buffering=0) as out:
        if unlimited and (limits.get("cpus") or limits.get("memory_mb")):
            count += 1
            note = f"[console] the job's CPU and memory limits are not enforced on this node: {unlimited}"
            out.write(json.dumps({"n": count, "t": time.time(), "s": note}).encode("utf-8") + b"\n")
        for raw in iter(proc.stdout.readline, b""):
            count += 1
            record = {"n": count, "t": time.time(), "s": clean_line(raw, limit)}
            out.write(json.dumps(record, ensure_ascii=False).encode("utf-8") + b"\n")
    code = proc.wait()
    if spec.get("sandbox") and 128 < code < 128 + 65:
        # bwrap reports a command killed by signal N as exit status 128 + N, as shells do.
        code = -(code - 128)
    oom_kills = cgroups.oom_kills([Path(d) for d in cgroup]) if cgroup else 0
    if cgroup:
        cgroups.remove([Path(d) for d in cgroup])
    write_json_atomic(
        run_dir / "exit.json",
        {
            "exit_code": code if code >= 0 else None,
            "signal": -code if code < 0 else None,
            "ended_at": time.time(),
            "lines": count,
            "oom_kills": oom_kills,
            "memory_limit_mb": limits.get("memory_mb") if limits else None,
        },
    )
    return 0


def make_cgroup(limits: dict) -> tuple[list[str], str]:
    """The run's own cgroup with its limits (its directories), or none and why."""
    found, why = cgroups.hierarchy(limits.get("cgroup_parent") or "")
    if found is None:
        return [], why
    try:
        directories = cgroups.create(
            found, f"{cgroups.RUN_PREFIX}{os.getpid()}", cpus=limits.get("cpus"), memory_mb=limits.get("memory_mb")
        )
    except OSError as exc:
        return [], f"cannot create a cgroup {found.mode}: {exc.strerror or exc}"
    return [str(d) for d in directories], ""


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
    pid reused by the system is never hit; the run's cgroup goes with it. Returns how many runs
    were killed.
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
        own = [Path(d) for d in info.get("cgroup") or () if isinstance(d, str) and cgroups.is_run_cgroup(d)]
        if own:
            cgroups.remove(own)  # its runner died before it could
        killed += 1
    return killed
