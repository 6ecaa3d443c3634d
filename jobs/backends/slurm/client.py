"""Slurm's own commands, as the console speaks them: ``sbatch``, ``scontrol``, ``scancel``.

Each call runs the command with an argument list (never a shell), a timeout, and the cluster's
``SLURM_CONF``; a non-zero exit is a :class:`SlurmError` with Slurm's own message. ``scontrol
show … -o`` prints one record per line as ``Key=Value`` pairs (a value may hold spaces: a reason,
a path); :func:`parse_record` reads them. ``squeue --json`` ignores ``-j`` in 22.05, and
``slurmrestd`` 0.0.38 has no requeue, drain or exclude: the commands are the interface here.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

TIMEOUT_S = 30.0
# A key of ``scontrol show -o``: a word (``JobId``, ``ExcNodeList``, ``CfgTRES``, ``OS``), maybe
# with ``:`` or ``/`` (``Gres``…): each pair starts at a space followed by such a key and ``=``.
_PAIR = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")
# Names a job's environment may not carry to ``sbatch``: its values reach sbatch's own environment
# (``--export=<names>``), where SBATCH_*/SLURM_* are read as options (another partition, account,
# QOS, config file) and LD_* by the loader. Slurm sets the job's own SLURM_* names itself.
_SLURM_READS = re.compile(r"^(?:SBATCH|SLURM|SALLOC|SRUN|SPANK|LD)_")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SlurmError(RuntimeError):
    """A Slurm command failed; the message is the command and what it printed."""


def parse_record(line: str) -> dict[str, str]:
    """``scontrol show -o``'s one-line record as a dict (``"(null)"`` as "")."""
    starts = list(_PAIR.finditer(line))
    record: dict[str, str] = {}
    for index, match in enumerate(starts):
        end = starts[index + 1].start() if index + 1 < len(starts) else len(line)
        value = line[match.end() : end].strip()
        record[match.group(1)] = "" if value == "(null)" else value
    return record


@dataclass(frozen=True)
class SlurmJob:
    job_id: int
    name: str
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, NODE_FAIL, PREEMPTED, REQUEUED…
    reason: str  # why it waits or ended: Priority, Resources, ReqNodeNotAvail, BeginTime, None…
    nodes: list[str]
    excluded: list[str]
    restarts: int
    exit_code: int | None
    exit_signal: int | None
    record: dict[str, str] = field(repr=False, default_factory=dict)

    @classmethod
    def from_record(cls, record: Mapping[str, str]) -> SlurmJob:
        code, _, signal = record.get("ExitCode", "").partition(":")
        return cls(
            job_id=int(record["JobId"]),
            name=record.get("JobName", ""),
            state=record.get("JobState", ""),
            reason=record.get("Reason", ""),
            nodes=expand_nodes(record.get("NodeList", "")),
            excluded=expand_nodes(record.get("ExcNodeList", "")),
            restarts=int(record.get("Restarts", "0") or 0),
            exit_code=int(code) if code.isdigit() else None,
            exit_signal=int(signal) if signal.isdigit() else None,
            record=dict(record),
        )


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str  # IDLE, ALLOCATED, MIXED, DRAIN (IDLE+DRAIN, …), DOWN, …
    reason: str
    gpus: int
    record: dict[str, str] = field(repr=False, default_factory=dict)
    cpus: int | None = None  # CPUTot
    memory_mb: int | None = None  # RealMemory
    address: str = ""  # NodeAddr: where its ranks are reached
    gpus_in_use: int = 0  # GPUs Slurm has allocated to jobs, anyone's (GresUsed)

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.state

    @classmethod
    def from_record(cls, record: Mapping[str, str]) -> SlurmNode:
        gres = re.search(r"gpu(?::[^:,(]+)?:(\d+)", record.get("Gres", ""))
        return cls(
            name=record["NodeName"],
            state=record.get("State", ""),
            # scontrol appends who set it and when: "Xid 79 … [root@2026-12-04T23:23:08]".
            reason=re.sub(r"\s*\[[^\]\s]+@[^\]\s]+\]$", "", record.get("Reason", "")),
            gpus=int(gres.group(1)) if gres else 0,
            record=dict(record),
            cpus=int(record["CPUTot"]) if record.get("CPUTot", "").isdigit() else None,
            memory_mb=int(record["RealMemory"]) if record.get("RealMemory", "").isdigit() else None,
            address=record.get("NodeAddr", ""),
            # ``scontrol show node -d``: "gpu:4", "gpu:a100:3(IDX:0-2)"; AllocTRES names it only
            # where accounting tracks GPUs (AccountingStorageTRES=gres/gpu).
            gpus_in_use=int(used.group(1)) if (used := re.search(r"gpu(?::[^:,(]+)?:(\d+)", record.get("GresUsed", ""))) else 0,
        )


def expand_nodes(hostlist: str) -> list[str]:
    """Node names of a Slurm hostlist as Slurm prints it (``node-a,node-b``; a numeric range
    ``gpu[01-03]`` is expanded by ``scontrol show hostnames``' rule, done here)."""
    names: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", hostlist or ""):
        match = re.fullmatch(r"(.*)\[([^\]]*)\](.*)", part)
        if not match:
            names.append(part)
            continue
        prefix, ranges, suffix = match.groups()
        for piece in ranges.split(","):
            low, _, high = piece.partition("-")
            for number in range(int(low), int(high or low) + 1):
                names.append(f"{prefix}{number:0{len(low)}d}{suffix}")
    return names


@dataclass(frozen=True)
class Submission:
    """One attempt as a Slurm batch job."""

    name: str
    script: str  # the batch script (a shell script; ``#SBATCH`` lines are not used)
    output: str  # the file stdout and stderr are appended to (``--open-mode=append``: a requeue keeps it)
    workdir: str
    gpus_per_node: int = 0
    nodes: int = 1
    exclude: Sequence[str] = ()
    time_limit_minutes: int | None = None
    grace_s: int = 30  # SIGTERM this long before the time limit (``--signal=B:TERM@N``)
    cpus_per_task: int | None = None
    memory_mb: int | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    environment: Mapping[str, str] = field(default_factory=dict)
    nodelist: Sequence[str] = ()  # the nodes it must run on (``--nodelist``): the console placed it there
    # Requeued by Slurm when preempted or its node fails (False: it ends PREEMPTED or NODE_FAIL,
    # and the console places a new attempt itself).
    requeue: bool = True
    comment: str = ""  # ``--comment``: kept in the job's records (``scontrol``, ``sacct``)
    user: str | None = None  # ``--uid``: the Unix user it runs as, where root submits for another


@dataclass
class Account:
    """A Slurm account as ``sacctmgr`` lists it: its GPU limit (None: none) and its users."""

    name: str
    gpu_limit: int | None = None
    users: set[str] = field(default_factory=set)


class SlurmClient:
    """The Slurm commands of one cluster (``env``: ``SLURM_CONF`` and whatever else they need)."""

    def __init__(self, env: Mapping[str, str] | None = None, *, timeout: float = TIMEOUT_S) -> None:
        self.env = dict(env or {})
        self.timeout = timeout

    def run(self, *command: str, stdin: str | None = None, extra_env: Mapping[str, str] | None = None) -> str:
        path = os.environ.get("PATH", "/usr/bin:/bin")
        env = {"PATH": path, "LANG": "C.UTF-8", **(extra_env or {}), **self.env}  # the cluster's names win
        # The command is found on the console's PATH, not on one the job's environment gives.
        executable = shutil.which(command[0], path=self.env.get("PATH", path)) or command[0]
        try:
            done = subprocess.run([executable, *command[1:]], input=stdin, capture_output=True, text=True, env=env, timeout=self.timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise SlurmError(f"{command[0]}: {error}") from error
        if done.returncode != 0:
            raise SlurmError(f"{' '.join(command[:2])}: {(done.stderr or done.stdout).strip()[:500]}")
        return done.stdout

    # --- jobs ----------------------------------------------------------------------------------
    def submit(self, submission: Submission) -> int:
        """Queues the attempt; returns its Slurm job id. The job's environment is
        ``submission.environment`` and Slurm's own ``SLURM_*`` names, nothing of this process's
        (``--export=<names>``, or ``NIL`` for none)."""
        args = [
            "sbatch", "--parsable", f"--job-name={submission.name}", f"--output={submission.output}",
            "--open-mode=append", f"--chdir={submission.workdir}", f"--nodes={submission.nodes}",
            "--ntasks-per-node=1", "--requeue" if submission.requeue else "--no-requeue",
            f"--signal=B:TERM@{max(1, submission.grace_s)}",
        ]  # fmt: skip
        if submission.nodelist:
            args.append(f"--nodelist={','.join(submission.nodelist)}")
        if submission.comment:
            args.append(f"--comment={_one_line(submission.comment)}")
        if submission.user:
            # Its primary group too: without --gid the job runs with root's group, and Slurm
            # cannot even write its output file.
            try:
                group = pwd.getpwnam(submission.user).pw_gid
            except KeyError:
                raise SlurmError(f"sbatch: not submitted: no Unix user {submission.user!r} on this machine") from None
            args += [f"--uid={submission.user}", f"--gid={group}"]
        if submission.gpus_per_node:
            args.append(f"--gres=gpu:{submission.gpus_per_node}")
        if submission.exclude:
            args.append(f"--exclude={','.join(submission.exclude)}")
        if submission.time_limit_minutes:
            args.append(f"--time={submission.time_limit_minutes}")
        if submission.cpus_per_task:
            args.append(f"--cpus-per-task={submission.cpus_per_task}")
        if submission.memory_mb:
            args.append(f"--mem={submission.memory_mb}M")
        for option, value in (("--partition", submission.partition), ("--account", submission.account), ("--qos", submission.qos)):
            if value:
                args.append(f"{option}={value}")
        names = sorted(submission.environment)
        refused = [name for name in names if not _ENV_NAME.match(name) or _SLURM_READS.match(name)]
        if refused:
            raise SlurmError(
                f"sbatch: not submitted: the job's environment names {', '.join(refused)[:200]} (Slurm's own names, the loader's, or not a variable name)"
            )
        args.append("--export=" + (",".join(names) if names else "NIL"))
        # sbatch takes the named variables' values from its own environment.
        out = self.run(*args, stdin=submission.script, extra_env=submission.environment)
        return int(out.strip().split(";")[0])

    def job(self, job_id: int) -> SlurmJob | None:
        """The job as ``scontrol show job`` sees it; None once Slurm has forgotten it (``MinJobAge``)."""
        try:
            out = self.run("scontrol", "show", "job", "-o", str(int(job_id)))
        except SlurmError as error:
            if "Invalid job id" in str(error):
                return None
            raise
        lines = [line for line in out.splitlines() if line.strip()]
        return SlurmJob.from_record(parse_record(lines[0])) if lines else None

    def jobs(self) -> list[SlurmJob]:
        out = self.run("scontrol", "show", "job", "-o")
        return [SlurmJob.from_record(parse_record(line)) for line in out.splitlines() if line.startswith("JobId=")]

    def cancel(self, job_id: int, *, signal: str | None = None, full: bool = True) -> None:
        """Cancel the job, or with ``signal`` send it to the batch script on its node: to every
        process of the batch step (``full``), or to the batch shell alone."""
        args = ["scancel", str(int(job_id))]
        if signal:
            args[1:1] = [f"--signal={signal}", "--batch", *(["--full"] if full else [])]
        self.run(*args)

    def requeue(self, job_id: int) -> None:
        """SIGTERM to the job, then back to PENDING with ``SLURM_RESTART_COUNT`` + 1. Returns
        before the job is PENDING (``wait_for_state``)."""
        self.run("scontrol", "requeue", str(int(job_id)))

    def exclude_and_start(self, job_id: int, nodes: Sequence[str]) -> None:
        """A pending job: never on ``nodes`` (its exclusions so far kept), and eligible now."""
        self.run("scontrol", "update", f"jobid={int(job_id)}", f"ExcNodeList={','.join(nodes)}", "StartTime=now")

    # --- accounts (slurmdbd) --------------------------------------------------------------------
    def accounting(self) -> bool:
        """Whether the cluster keeps accounts (``AccountingStorageType=accounting_storage/slurmdbd``):
        only then do accounts and their limits exist."""
        out = self.run("scontrol", "show", "config")
        return any(line.split("=", 1)[0].strip() == "AccountingStorageType" and "slurmdbd" in line for line in out.splitlines())

    def accounts(self) -> dict[str, Account]:
        """The cluster's accounts with their GPU limit (``GrpTRES=gres/gpu=N``) and their users."""
        out = self.run("sacctmgr", "--noheader", "--parsable2", "list", "associations", "format=account,user,grptres")
        found: dict[str, Account] = {}
        for line in out.splitlines():
            fields = line.split("|")
            if len(fields) != 3 or not fields[0]:
                continue
            name, user, tres = fields
            account = found.setdefault(name, Account(name=name))
            if user:
                account.users.add(user)
            else:
                limits = dict(item.split("=", 1) for item in tres.split(",") if "=" in item)
                account.gpu_limit = int(limits["gres/gpu"]) if limits.get("gres/gpu", "").isdigit() else None
        return found

    def set_account(self, name: str, *, gpu_limit: int | None, user: str, description: str = "") -> None:
        """The account exists with ``GrpTRES=gres/gpu=<gpu_limit>`` (None: no limit) and ``user``
        may submit to it; an existing account keeps its other settings."""
        known = self.accounts().get(name)
        if known is None:
            self.run("sacctmgr", "--immediate", "add", "account", name, f"Description={_one_line(description or name)}", "Organization=console")
            known = Account(name=name)
        if known.gpu_limit != gpu_limit:
            self.run(
                "sacctmgr", "--immediate", "modify", "account", "where", f"name={name}", "set", f"GrpTRES=gres/gpu={-1 if gpu_limit is None else gpu_limit}"
            )
        if user not in known.users:
            self.run("sacctmgr", "--immediate", "add", "user", user, f"account={name}")

    # --- nodes ---------------------------------------------------------------------------------
    def nodes(self) -> list[SlurmNode]:
        out = self.run("scontrol", "show", "node", "-o", "-d")  # -d: GresUsed
        return [SlurmNode.from_record(parse_record(line)) for line in out.splitlines() if line.startswith("NodeName=")]

    def drain(self, node: str, reason: str) -> None:
        """The node takes no new job (its running ones go on) until ``resume``; Slurm shows the reason."""
        self.run("scontrol", "update", f"nodename={node}", "state=drain", f"reason={_one_line(reason)}")

    def resume(self, node: str) -> None:
        self.run("scontrol", "update", f"nodename={node}", "state=resume")


def _one_line(text: str) -> str:
    return " ".join(text.split())[:250] or "no reason given"
