"""The supervisor of one training process on a node: ``python -m agent.runner SPEC``.

Standard library only, no Django: the node agent starts it detached (its own session), so a
restart of the console or the agent does not touch the training run. It

1. starts the command with ``bash -c`` in a container (``podman run``, ``agent.sandbox``; on
   the host only where an operator turned containers off), in a new process group, and records
   that group and the container's first process in its pid record (the agent signals the run's
   processes through them);
2. captures stdout and stderr merged, line by line and in order, as output records (line
   number, time, text): invalid UTF-8 is replaced, carriage-return progress bars collapse to
   their last state, a line longer than the limit is cut with a visible marker *while it is
   read* (the runner's memory stays bounded whatever a job prints), and the output stops growing
   at the job's log cap, in lines and in bytes, keeping the run's last lines for its end
   (``agent.output_cap``);
3. writes its exit record (exit code or signal, and whether the kernel killed a process of the
   run for exceeding its memory limit, or the run was ended at its PID limit) once the output is
   complete.

The files, their fields and the order they are written in are ``agent.runfiles``'.

Where the spec asks for ``limits``, the whole run (the container and everything in it) starts
in a cgroup of its own with the run's CPU, memory and PID limits (``agent.cgroups``), removed
when the run ends; where the node allows none, the run goes on without and its log's first line
says so. Nothing of the job's environment reaches a process run here as root: Podman gets a
fixed environment and reads the job's from a file only the agent can read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from agent import allocation, cgroups, networks, rootless, runfiles, sandbox
from agent.output_cap import OutputCap
from agent.runfiles import ExitRecord, OutputWriter, PidRecord
from agent.sandbox import ContainerPolicy, RunLimits, container_argv, env_file_text, root_tool_env

CUT_MARKER = " …[line cut at {limit} characters]"
CHUNK = 65536
# After a read that emptied the command's pipe, the runner waits this long before the next one
# (a line printed meanwhile waits at most that): a run printing line by line costs a read, a
# write and a wake-up per few lines, not per line.
GATHER_SECONDS = 0.005
PIDS_LIMIT_GRACE = 2.0  # seconds a run may sit at its PID limit before it is ended


def clean_line(raw: bytes, limit: int, *, cut: bool = False) -> str:
    text = raw.rstrip(b"\n").decode("utf-8", errors="replace")
    if text.endswith("\r"):
        text = text[:-1]
    if "\r" in text:
        # A progress bar redraws itself with \r: keep what the terminal would show last.
        parts = [p for p in text.split("\r") if p]
        text = parts[-1] if parts else ""
    if len(text) > limit or cut:
        text = text[:limit] + CUT_MARKER.format(limit=limit)
    return text


def read_lines(fd: int, limit: int, *, flush: Callable[[], float | None] | None = None, gather: float = 0.0) -> Iterator[tuple[bytes, bool]]:
    """The lines read from ``fd`` as (bytes, cut), never holding more than about 4 × ``limit``
    bytes of one line (a UTF-8 character is at most 4 bytes): the rest of a longer line is
    dropped as it arrives, and the line is marked cut.

    ``flush`` is called before each read that may wait, so what the lines already read made is
    written first; where it returns a number of seconds, it is called again after that long
    without output (the log cap's held lines are written on time). With ``gather``, after a read
    that emptied the pipe the next one waits that many seconds: a command printing a line at a
    time (``print(…, flush=True)``) is read a few lines at a time, not with a read, a write and a
    wake-up for every line."""
    cap = 4 * limit + 4
    line = bytearray()
    cut = False
    while True:
        if flush is not None:
            wait = flush()
            while wait is not None and not select.select([fd], [], [], wait)[0]:
                wait = flush()
        chunk = os.read(fd, CHUNK)
        if not chunk:
            break
        start = 0
        while start < len(chunk):
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start : end + 1]
            start = len(chunk) if end < 0 else end + 1
            if not cut:
                line += piece
                if len(line) > cap:
                    # A progress bar's last redraw is what is kept; else the line's head.
                    at = line.rfind(b"\r", 0, len(line) - 1)
                    if at >= 0 and len(line) - at - 1 <= cap:
                        del line[: at + 1]
                    else:
                        del line[cap:]
                        cut = True
            if end >= 0:
                yield bytes(line), cut
                line.clear()
                cut = False
        if gather and len(chunk) < CHUNK:
            if flush is not None:
                flush()
            time.sleep(gather)
    if line:
        yield bytes(line), cut


class Watch(threading.Thread):
    """While the run lives: records the container's first process in the pid record once Podman
    has written it, and ends the run if it sits at its PID limit (a fork loop)."""

    def __init__(self, run_dir: Path, record: PidRecord, container: bool, cgroup: list[str], proc: subprocess.Popen[bytes]) -> None:
        super().__init__(daemon=True)
        self.run_dir, self.record, self.container, self.cgroup, self.proc = run_dir, record, container, cgroup, proc
        self.pids_limit_hit: int | None = None
        self.done = threading.Event()

    def run(self) -> None:
        at_limit_since = None
        while not self.done.wait(0.1 if self.container else 0.5):
            if self.container:
                pid = runfiles.read_container_pid(self.run_dir)
                if pid is not None:
                    self.record = dataclasses.replace(self.record, container_pid=pid)
                    runfiles.write_pid(self.run_dir, self.record)
                    self.container = False
            if not self.cgroup:
                continue
            limit = cgroups.pids_at_limit([Path(d) for d in self.cgroup])
            if limit is None:
                at_limit_since = None
            elif at_limit_since is None:
                at_limit_since = time.monotonic()
            elif time.monotonic() - at_limit_since >= PIDS_LIMIT_GRACE:
                self.pids_limit_hit = limit
                cgroups.kill_all([Path(d) for d in self.cgroup])
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                return


def run(spec_path: Path) -> int:
    spec = runfiles.read_spec(spec_path)
    run_dir = spec_path.parent
    secrets = spec.secret_env
    if secrets:
        # Read once: the spec left on disk names no secret (the agent reads it again for the
        # container's name and the resume step, never for these).
        spec = dataclasses.replace(spec, secret_env={})
        runfiles.rewrite_spec(spec_path, spec)
    limit, policy, limits = spec.max_line_chars, spec.container, spec.limits
    # Started rootless by a scheduler's account: the scheduler's cgroups hold the run.
    unprivileged = (policy or {}).get("rootless")
    cgroup, unlimited = make_cgroup(limits) if limits is not None and not unprivileged else ([], "")
    notes: list[str] = []
    parent = None
    popen: dict[str, Any] = {}
    scheduler_job = os.environ.get("SLURM_JOB_ID", "")
    placed = allocation.follow(spec.env, policy, os.environ) if scheduler_job else None
    if placed is not None:
        spec, policy = dataclasses.replace(spec, env=placed.env), placed.policy
    network: networks.JobNetwork | None = None
    engine_env: dict[str, str] = {}
    if policy:
        node = placed.node if placed is not None and placed.node else str(policy.get("hostname") or "")
        engine_env = rootless.engine_env(unprivileged["storage"], node) if unprivileged else root_tool_env(policy.get("engine_env"))
        # A container of this name left by a runner killed outright would refuse the name.
        sandbox.remove_container(str(policy["podman"]), policy["name"], engine_env)
        if unprivileged:
            pulled, said = rootless.pull(
                str(policy["podman"]), policy["image"], env=engine_env, auth_file=run_dir / runfiles.PULL_AUTH_FILE, tls_verify=unprivileged["tls_verify"]
            )
            if not pulled:
                return refuse_start(run_dir, spec, cgroup, f"[console] the image could not be pulled on {node}: {said}")
            if said:
                notes.append(f"[console] {said} on {node}")
        try:
            network = join_network(policy, engine_env) if not unprivileged else None
            seccomp = sandbox.seccomp_profile(run_dir=secrets_dir(policy, engine_env))
        except (networks.NetworkUnavailable, OSError, ValueError) as exc:
            return refuse_start(run_dir, spec, cgroup, f"[console] the run could not start: {exc}")
        if network is not None:
            spec = dataclasses.replace(spec, env={**spec.env, "MASTER_ADDR": network.master_addr})
        env_text, left_out = env_file_text(spec.env)
        if left_out:
            notes.append(f"[console] not passed to the run (a newline in the value): {', '.join(sorted(left_out))}")
        env_file = runfiles.write_env(run_dir, env_text)
        secret_file = sandbox.write_secret_env(policy["name"], secrets, int(policy["user"]), run_dir=secrets_dir(policy, engine_env)) if secrets else None
        pidfile = runfiles.container_pidfile(run_dir)
        parent = cgroups.relative(Path(cgroup[0])) if cgroup else None
        argv = container_argv(
            spec.command,
            policy=policy,
            env_file=str(env_file),
            cgroup_parent=parent,
            pidfile=str(pidfile),
            network=(network.name, network.address) if network is not None else None,
            secret_file=secret_file,
            seccomp=seccomp,
        )
        popen = dict(cwd=str(run_dir), env=engine_env)
    else:
        Path(spec.cwd).mkdir(parents=True, exist_ok=True)
        argv = ["bash", "-c", spec.command]
        popen = dict(cwd=spec.cwd, env={**spec.env, **secrets})
    popen.update(stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # The child joins the cgroup before it runs anything: the whole run starts inside.
        proc = subprocess.Popen(argv, preexec_fn=(lambda: cgroups.join_self(cgroup)) if cgroup else None, **popen)  # noqa: PLW1509 - no Popen option for it; the hook only writes cgroup.procs
    except subprocess.SubprocessError as exc:
        cgroups.remove([Path(d) for d in cgroup])
        cgroup, unlimited = [], f"could not join the run's cgroup ({exc})"
        argv = [a for a in argv if a != "--cgroup-parent" and a != parent] if policy else argv
        proc = subprocess.Popen(argv, **popen)
    record = PidRecord(
        runner_pid=os.getpid(),
        pgid=proc.pid,
        started_at=time.time(),
        cgroup=tuple(cgroup),
        container=policy["name"] if policy else None,
        gpus=placed.gpus if placed is not None else None,
        node=placed.node if placed is not None else None,
    )
    runfiles.write_pid(run_dir, record)
    watch = Watch(run_dir, record, bool(policy), cgroup, proc)
    watch.start()
    if scheduler_job:
        # Run by a cluster's scheduler (Slurm), the runner is the batch job: its SIGTERM (a
        # preemption's grace, a cancel) is the run's, passed on so the training can checkpoint.
        signal.signal(signal.SIGTERM, lambda *_: forward_term(watch.record, bool(policy)))
        # Its SIGUSR1 is the console's SIGKILL for the run (a fatal GPU event): the run dies, the
        # runner lives to pass on the run's last lines and record its exit.
        signal.signal(signal.SIGUSR1, lambda *_: forward_kill(watch.record))
    assert proc.stdout is not None
    with OutputWriter(run_dir) as out:
        if unlimited and limits and (limits.get("cpus") or limits.get("memory_mb")):
            out.emit(f"[console] the job's CPU and memory limits are not enforced on this node: {unlimited}", time.time())
        for note in [*spec.preamble, *notes]:
            out.emit(note, time.time())
        # The platform's lines above are not counted against the cap; past it, the run's last
        # lines are held and written once its output is closed (its end is always in the file).
        cap = OutputCap(out, spec.max_lines, spec.max_bytes, spec.tail_lines)
        for raw, cut in read_lines(proc.stdout.fileno(), limit, flush=cap.flush, gather=GATHER_SECONDS):
            cap.take(clean_line(raw, limit, cut=cut), time.time())
        cap.finish(time.time())
        count = out.count
    code = proc.wait()
    watch.done.set()
    watch.join(timeout=5)
    if policy and 128 < code < 128 + 65:
        # Podman (and the container's init) report a command killed by signal N as exit status
        # 128 + N, as shells do.
        code = -(code - 128)
    directories = [Path(d) for d in cgroup]
    oom_kills = cgroups.oom_kills(directories) if cgroup else 0
    memory_mb = limits.get("memory_mb") if limits else None
    if cgroup and not oom_kills and code == -signal.SIGKILL and watch.pids_limit_hit is None and memory_mb:
        oom_kills = 1 if cgroups.memory_limit_reached(directories) else 0
    if policy:
        runfiles.remove_env(run_dir)
        # Nothing the run was given outlives it: its container (Podman's record of its
        # environment, its writable layer), its secrets file, and, with the last rank, its network.
        # Before the cgroup goes: removing it kills Podman's monitor (conmon) in the middle of its
        # clean-up, which leaves the container "Stopping" for good.
        remove_run_container(policy, engine_env, network)
    if cgroup:
        cgroups.remove(directories)
        if policy and parent:
            cgroups.remove_everywhere(parent)
    runfiles.write_exit(
        run_dir,
        ExitRecord(
            exit_code=code if code >= 0 else None,
            signal=-code if code < 0 else None,
            ended_at=time.time(),
            lines=count,
            oom_kills=oom_kills,
            memory_limit_mb=memory_mb,
            pids_limit_hit=watch.pids_limit_hit,
        ),
    )
    # Run by a cluster's scheduler, the runner's status is the run's, so the cluster's own records
    # (``sacct``) say how it ended: COMPLETED, or FAILED with its code (128 + N: killed by N).
    return (code if code >= 0 else 128 - code) & 0xFF if scheduler_job else 0


def forward_kill(record: PidRecord) -> None:
    """SIGKILL to the run as ``agent.processes.signal_run`` sends it: the container's init (its
    death ends the whole container) and the run's process group (Podman's client)."""
    for kill, target in ((os.kill, record.container_pid), (os.killpg, record.pgid)):
        if target:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(target, signal.SIGKILL)


def forward_term(record: PidRecord, container: bool) -> None:
    """SIGTERM to the run's processes as ``agent.processes.signal_run`` sends it, from /proc alone:
    in a container every process but its init and the command's own shell (the container ends
    with them), else the run's process group."""
    if not container:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(record.pgid or 0, signal.SIGTERM)
        return
    init = record.container_pid
    if init is None:
        return
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    todo = [(pid, init) for pid in children.get(init, [])]
    while todo:
        pid, parent = todo.pop()
        todo += [(child, pid) for child in children.get(pid, [])]
        try:
            if parent == init and Path(f"/proc/{pid}/comm").read_text().strip() == "bash":
                continue
            os.kill(pid, signal.SIGTERM)
        except (OSError, ProcessLookupError):
            pass


def make_cgroup(limits: RunLimits) -> tuple[list[str], str]:
    """The run's own cgroup with its limits (its directories), or none and why."""
    found, why = cgroups.hierarchy(limits.get("cgroup_parent") or "", same_path=bool(limits.get("same_path")))
    if found is None:
        return [], why
    try:
        directories = cgroups.create(
            found,
            f"{cgroups.RUN_PREFIX}{os.getpid()}",
            cpus=limits.get("cpus"),
            memory_mb=limits.get("memory_mb"),
            pids=limits.get("pids"),
        )
    except OSError as exc:
        return [], f"cannot create a cgroup {found.mode}: {exc.strerror or exc}"
    return [str(d) for d in directories], ""


def slurm_epilog() -> int:
    """Slurm's ``Epilog`` on the node (root, after the job ended): the run's container is removed.
    Podman's monitor escapes the job's processes, so a runner Slurm killed outright (the end of a
    preemption's grace, ``scancel``) leaves its container behind. The run directory is the one the
    console submitted the job with (its output file, ``StdOut``): the agent's own, no job's."""
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if not job_id.isdigit():
        return 0
    node, uid = os.environ.get("SLURMD_NODENAME", ""), os.environ.get("SLURM_JOB_UID", "")
    if uid.isdigit() and uid != "0":
        # A rootless run's container nests below the job's step: what Slurm did not kill.
        rootless.reap_job_cgroups(node, uid, job_id)
    try:
        shown = subprocess.run(["scontrol", "show", "job", "-o", job_id], check=False, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    found = re.search(r"\bStdOut=(\S+)", shown)
    if found and found.group(1).endswith("/" + runfiles.RUNNER_LOG_FILE):
        # Rank 0's run directory; every rank of the attempt is its sibling (a container not on
        # this node is not found, and nothing happens).
        removed = False
        for directory in sorted(Path(found.group(1)).parent.parent.glob("rank-*")):
            policy = runfiles.spec_container(directory) or {}
            if policy.get("rootless") and uid.isdigit():
                if not removed:  # all of the job's on this node, by its label
                    rootless.remove_slurm_containers(str(policy.get("podman")), job_id, node=node, uid=int(uid), storage=policy["rootless"]["storage"])
                    removed = True
                if policy.get("name"):
                    sandbox.remove_secret_env(str(policy["name"]), run_dir=rootless.runtime_dir(int(uid), node))
                continue
            remove_container(directory)
    return 0


def main() -> int:
    if sys.argv[1:] == ["--slurm-epilog"]:
        return slurm_epilog()
    # The run outlives whoever started us: a console restart's SIGHUP/SIGINT must not stop it.
    for sig in (signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    specs = sys.argv[1:]
    if len(specs) > 1:
        # One spec per rank, the ranks started together by ``srun`` (one task per node): this
        # task's rank is its place in the allocation.
        rank = os.environ.get("SLURM_PROCID", "")
        if not rank.isdigit() or int(rank) >= len(specs):
            print(f"agent.runner: {len(specs)} specs and no task rank among them (SLURM_PROCID={rank!r})", file=sys.stderr)
            return 2
        return run(Path(specs[int(rank)]))
    return run(Path(specs[0]))


def kill_unfinished_runs(work_root: Path) -> int:
    """SIGKILL every run under ``work_root`` whose supervisor still lives (tests and benchmarks
    clean up with it: runs sit in their own sessions and outlive whoever started them).

    A run counts only while its supervisor's pid is still a ``agent.runner`` process, so a
    pid reused by the system is never hit; the run's cgroup goes with it. Returns how many runs
    were killed.
    """
    killed = 0
    for directory in runfiles.unfinished_run_dirs(work_root):
        record = runfiles.read_pid(directory)
        if record is None or record.runner_pid is None or record.pgid is None:
            continue
        try:
            cmdline = Path(f"/proc/{record.runner_pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"agent.runner" not in cmdline:
            continue
        for kill, target in ((os.killpg, record.pgid), (os.kill, record.runner_pid)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(target, signal.SIGKILL)
        remove_container(directory)  # before its cgroup (and Podman's monitor in it) goes
        own = [Path(d) for d in record.cgroup if cgroups.is_run_cgroup(d)]
        if own:
            cgroups.remove(own)  # its runner died before it could
        killed += 1
    return killed


def join_network(policy: ContainerPolicy, engine_env: dict[str, str]) -> networks.JobNetwork | None:
    """The attempt's network for a run whose policy asks for one (``agent.networks``)."""
    wanted = policy.get("job_network") if policy.get("network") == "job" else None
    if not wanted:
        return None
    return networks.join(
        str(wanted["name"]),
        rank=int(wanted["rank"]),
        egress=str(wanted["egress"]),
        pool=str(wanted["pool"]),
        deny=[str(d) for d in wanted.get("deny") or []],
        podman=str(policy["podman"]),
        env=engine_env,
        labels=policy.get("labels") or {},
    )


def remove_run_container(policy: ContainerPolicy, engine_env: dict[str, str], network: networks.JobNetwork | None = None) -> None:
    """Remove what the run was given: its container, its secrets file and, where it was the
    attempt's last rank, its job network (``network``: the one it joined; None for a run killed
    outright, whose network is found by its name)."""
    name = str(policy.get("name") or "")
    podman = str(policy["podman"])
    wanted = policy.get("job_network") if policy.get("network") == "job" else None
    try:
        sandbox.remove_container(podman, name, engine_env)
        if network is not None:
            networks.leave(network, podman=podman, env=engine_env)
        elif wanted:
            networks.remove_unused(str(wanted["name"]), podman=podman, env=engine_env)
    except (OSError, subprocess.SubprocessError):
        pass
    sandbox.remove_secret_env(name, run_dir=secrets_dir(policy, engine_env))


def secrets_dir(policy: ContainerPolicy, engine_env: Mapping[str, str]) -> Path:
    """Where the run's secrets file and seccomp profile go: the node's ``/run/satrain``, or a
    rootless account's runtime directory (memory too)."""
    return Path(engine_env["XDG_RUNTIME_DIR"]) if policy.get("rootless") else sandbox.NODE_RUN_DIR


def refuse_start(run_dir: Path, spec: runfiles.RunSpec, cgroup: list[str], line: str) -> int:
    """A run the node could not start (its network, its seccomp profile): its log says why and
    its exit record is the container engine's 'could not start' (125)."""
    if cgroup:
        cgroups.remove([Path(d) for d in cgroup])
    runfiles.write_pid(run_dir, PidRecord(runner_pid=os.getpid(), pgid=None, started_at=time.time()))
    with OutputWriter(run_dir) as out:
        for note in [*spec.preamble, line]:
            out.emit(note, time.time())
        count = out.count
    runfiles.write_exit(run_dir, ExitRecord(exit_code=125, signal=None, ended_at=time.time(), lines=count))
    return 0


def remove_container(run_dir: Path) -> None:
    """Remove a killed run's container (its runner could not: Podman keeps a container whose
    monitor was killed), its secrets and its job network. A rootless run's are its account's:
    the cluster's Epilog removes them (``slurm_epilog``)."""
    policy = runfiles.spec_container(run_dir) or {}
    if policy.get("podman") and policy.get("name") and not policy.get("rootless"):
        remove_run_container(policy, root_tool_env(policy.get("engine_env")))


if __name__ == "__main__":
    sys.exit(main())
