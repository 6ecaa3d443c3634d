"""The engine of a Slurm cluster (``BACKEND=slurm``; docs/slurm.md): ``SlurmEngine``.

The console still decides whether a job may go (its fair share across projects, the job's
exclusions, the nodes' health) and the agent still prepares each rank as on its own nodes: the
image pulled, the run's directories, the fence, the checkpoint it resumes from, its container
and environment (``agent.launch``). What changes is who places, starts and ends the run:
**Slurm**. Each attempt is one batch job of its whole shape (``jobs.backends.slurm``): ``sbatch``
with ``-N`` its ranks and each node's GPUs as GRES, never on the job's excluded nodes, its CPUs
and memory, the max run time as ``--time`` with SIGTERM the grace period before it, Spot work in
the preemptible partition, wherever Slurm places it; its ranks' runners (``agent.runner`` on
their specs) start together (``srun``) and start their containers as on the agents, so the
output, banners, resource samples and exit record are the same files (``agent.runfiles``); each
pid record names the node and GPUs Slurm gave the rank, and the console follows.

What only Slurm knows comes from Slurm's own records, read once per ``SLURM_POLL_INTERVAL`` for
every run (one ``scontrol show job`` and one ``scontrol show node``):

* a run still queued shows Slurm's reason on the job (``Resources``, ``Priority``,
  ``ReqNodeNotAvail``…); one Slurm ended before it started fails its launch with Slurm's words;
* how a run ended: a run Slurm preempted for On-Demand work (``PREEMPTED``) is a Spot reclaim,
  back to ``Pending`` and never a failover; a job Slurm cancelled or timed out says so;
* each node's Slurm state and reason (``Node.backend_state``): a drained or down node takes no new
  attempt, and a node Slurm took as down (slurmd silent) is lost, its runs failed over
  (``failover.services.policy.sweep_lost_nodes``);
* the console's health verdicts reach Slurm: a node with an unhealthy GPU (an Xid 79) or cordoned
  is drained with the fault's reason, and returned (``state=resume``) once an operator marks it
  healthy.
"""

from __future__ import annotations

import getpass
import logging
import math
import os
import pwd
import shlex
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db.models import Count

from agent import runfiles
from agent.inventory import GpuSpec, NodeSpec, nvml_nodes
from agent.launch import Launcher, simulated_devices
from agent.node_agent import NodeAgent
from agent.ports import LoopView, PreparedRank, RunAccount
from agent.processes import RUNNER_MODULE, run_dir
from agent.sandbox import root_tool_env
from jobs.backends.base import Backend, state_takes_work
from jobs.backends.facts import Ended, EndKind, EvidenceSource, NodeCheckFiles, describe
from jobs.backends.slurm.client import SlurmClient, SlurmError
from jobs.backends.slurm.scheduler import AttemptObservation, AttemptSpec, NodeView, SlurmScheduler
from jobs.models import GPU, AttemptNode, JobAttempt, Node, Project, TrainingJob
from jobs.services import runs, wakeups
from jobs.services.limits import limits_of
from jobs.services.paths import job_dir

logger = logging.getLogger(__name__)

# The prefix of the reasons the console drains nodes with: only those does it resume.
DRAIN_PREFIX = "console:"
# How long a rank's exit waits for Slurm to record how the job ended (seconds; a preemption or a
# cancel is known only from Slurm's record), before it is reported as the run's exit record says.
FINAL_STATE_WAIT = 20.0
# The final states in which Slurm, not the run, ended a batch job the console had not asked to stop.
SLURM_ENDS = {"CANCELLED": EndKind.CANCELLED, "TIMEOUT": EndKind.TIME_LIMIT, "NODE_FAIL": EndKind.NODE_LOST}
FINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "UNKNOWN"})


def slurm_scheduler() -> SlurmScheduler:
    env = {"SLURM_CONF": settings.SLURM_CONF} if settings.SLURM_CONF else {}
    return SlurmScheduler(
        SlurmClient(env=env), spot_partition=settings.SLURM_SPOT_PARTITION or None, spot_qos=settings.SLURM_SPOT_QOS or None,
        partition=settings.SLURM_PARTITION or None,
    )  # fmt: skip


def slurm_nodes(views: list[NodeView]) -> list[NodeSpec]:
    """The cluster's nodes as the console registers them: their GPUs are Slurm's GRES count, real
    where the node's own check saw GPUs through NVML (``NodeCheckFiles.gpus_seen``), simulated
    (faults injectable) where it saw none; a node not checked yet is taken as this machine is
    (its NVML) until its check says (``SlurmRuns.mirror_nodes``)."""
    forced = forced_simulation()
    host = None if forced else nvml_nodes()
    files = node_check_files()
    specs = []
    for view in views:
        seen = None if forced else files.gpus_seen(view.name)
        real = not forced and (seen if seen is not None else host is not None)
        model = host[0].gpu_model if real and host else settings.SIMULATED_GPU_MODEL
        specs.append(
            NodeSpec(
                name=view.name,
                gpu_model=model,
                simulated=not real,
                gpus=tuple(GpuSpec(index=i, uuid=f"GPU-slurm-{view.name}-{i}", model=model, memory_mb=81559) for i in range(view.gpus)),
                cpu_count=view.cpus,
                memory_mb=view.memory_mb,
                address=view.address or None,
            )
        )
    return specs


def forced_simulation() -> bool:
    return str(settings.SIMULATED_GPUS).lower() in {"1", "true", "yes"}


def node_check_files() -> NodeCheckFiles:
    """Where the nodes' own checks hand their evidence over (``SLURM_HEALTH_DIR``; empty:
    ``VAR_DIR/slurm-health``)."""
    return NodeCheckFiles(Path(settings.SLURM_HEALTH_DIR) if settings.SLURM_HEALTH_DIR else settings.VAR_DIR / "slurm-health")


class ProjectAccounts:
    """Each project as a Slurm account (``SLURM_ACCOUNT_PREFIX`` + its name) whose
    ``GrpTRES=gres/gpu=N`` is the project's ceiling, its quota plus its borrow limit (none where it
    may borrow without limit): Slurm then holds the project's work beyond it, whoever submits."""

    def __init__(self, client: SlurmClient, user: str | None = None) -> None:
        self.client = client
        self.user = user or getpass.getuser()  # the jobs' user: it must be a user of each account
        self.applied: dict[str, int | None] = {}  # account → the GPU limit set on it
        self.refused: dict[str, int | None] = {}  # account → the GPU limit sacctmgr refused (not retried by ``sync``)

    @staticmethod
    def name(project: Project) -> str:
        return f"{settings.SLURM_ACCOUNT_PREFIX}{project.name}"

    @staticmethod
    def limit(project: Project) -> int | None:
        return None if project.gpu_borrow_limit is None else project.gpu_quota + project.gpu_borrow_limit

    def ensure(self, project: Project) -> str:
        """The project's account, created or its limit updated if it changed since last set."""
        name, limit = self.name(project), self.limit(project)
        if name not in self.applied or self.applied[name] != limit:
            try:
                self.client.set_account(name, gpu_limit=limit, user=self.user, description=f"console project {project.name}")
            except SlurmError:
                self.refused[name] = limit
                raise
            self.applied[name] = limit
            self.refused.pop(name, None)
            logger.info("Slurm account %s: GrpTRES=gres/gpu=%s", name, "none" if limit is None else limit)
        return name

    def sync(self) -> None:
        """Quota or borrow limit changed in the console since: the accounts follow."""
        names = [n.removeprefix(settings.SLURM_ACCOUNT_PREFIX) for n in {*self.applied, *self.refused}]
        for project in Project.objects.filter(name__in=names):
            name, limit = self.name(project), self.limit(project)
            if self.applied.get(name, -1) != limit and self.refused.get(name, -1) != limit:
                self.ensure(project)


def project_accounts(client: SlurmClient, user: str | None = None) -> ProjectAccounts | None:
    """``SLURM_ACCOUNTS``: on, off, or (auto) on where the cluster keeps accounts."""
    mode = str(settings.SLURM_ACCOUNTS).lower()
    if mode in {"off", "0", "false", "no"}:
        return None
    if mode == "auto":
        try:
            if not client.accounting():
                return None
        except SlurmError as error:
            logger.warning("Slurm: could not tell whether the cluster keeps accounts (%s): jobs go to the default account", error)
            return None
    return ProjectAccounts(client, user)


def run_account() -> RunAccount | None:
    """The account Slurm runs every rank as (docs/slurm-site.md): ``SLURM_USER``, else the
    console's own user where it is not root; None for a console run as root without one (the
    ranks run as root, their containers rootful: only where the cluster allows root jobs and
    does not constrain devices)."""
    name = settings.SLURM_USER or ("" if os.geteuid() == 0 else getpass.getuser())
    if not name:
        return None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise ImproperlyConfigured(f"SLURM_USER={name!r}: no such Unix user on this machine (it must exist on every node)") from None
    if entry.pw_uid == 0:
        return None
    return RunAccount(name=name, uid=entry.pw_uid, gid=entry.pw_gid, storage=settings.SLURM_NODE_STORAGE)


# Slurm's waiting reasons that need words for a console user.
REASONS = {
    "AssocGrpGRES": "the project's Slurm account is at its GPU limit (GrpTRES)",
    "AssocGrpGRESRunMinutes": "the project's Slurm account is at its GPU-minutes limit",
    "AssocGrpCpuLimit": "the project's Slurm account is at its CPU limit (GrpTRES)",
}


@dataclass
class Queued:
    """A rank handed to Slurm whose runner has not started yet."""

    part: AttemptNode
    handle: str
    workdir: str
    resume_step: int | None
    reason: str = ""


class SlurmLaunch:
    """Slurm's launch port (``agent.ports.LaunchPort``): each attempt is one Slurm batch job, its
    ranks' runners (``agent.runner`` on their specs) started together by ``srun`` in its
    allocation, and signalled through Slurm."""

    def __init__(self, scheduler: SlurmScheduler) -> None:
        self.scheduler = scheduler
        self.queued: dict[int, Queued] = {}  # AttemptNode id → its queued batch job
        self.run_as = run_account()
        self.python = settings.SLURM_RUNNER_PYTHON if self.run_as is not None else sys.executable
        self.accounts = project_accounts(scheduler.client, self.run_as.name if self.run_as else None)
        self.sent: dict[str, set[int]] = {}  # a several-rank batch job → the signals sent to all its ranks

    def account(self) -> RunAccount | None:
        return self.run_as

    def submit(self, job: TrainingJob, attempt: JobAttempt, ranks: Sequence[PreparedRank], *, workdir: str, resume_step: int | None) -> None:
        """The attempt as one batch job of its whole shape: ``-N`` its ranks, each node's GPUs as
        GRES, never on the job's excluded nodes, its CPUs, memory, max run time, the project's
        account and Spot's partition, wherever Slurm places it (no ``--nodelist``: Slurm knows
        what other work holds). Its ranks start together (``srun``, one task per node, each
        runner on its rank's spec); each start is reported when seen (``SlurmRuns.settle_queued``),
        on the node and GPUs Slurm chose."""
        ranks = sorted(ranks, key=lambda rank: rank[0].rank)
        first, first_directory, _ = ranks[0]
        if first.node.simulated:
            # Slurm may run a rank on any of the cluster's nodes: each has its stand-in GPUs.
            for node in Node.objects.filter(agent=first.node.agent, simulated=True).annotate(gpu_count=Count("gpus")):
                simulated_devices(node.name, node.gpu_count)
        limits = limits_of(job)
        excluded = sorted(set(job.exclusions.filter(gpu__isnull=True).values_list("node__name", flat=True)))
        spec = AttemptSpec(
            key=f"satrain-{job.pk}-{attempt.number}",
            # The ranks' supervisors run on the nodes' Python where an account runs them (it may not
            # reach the console's, under /root …), else on the console's own.
            command=shlex.join([self.python, "-m", RUNNER_MODULE, *(str(spec_path) for _, _, spec_path in ranks)]),
            workdir=str(settings.BASE_DIR),
            output=str(first_directory / runfiles.RUNNER_LOG_FILE),
            environment=root_tool_env({"PYTHONPATH": str(settings.BASE_DIR)}),
            gpus_per_node=job.gpus_per_node,
            nodes=len(ranks),
            exclude=tuple(excluded),
            # Slurm's time limit backs up the console's own max run time (its stop, with the grace
            # period, comes first and says so): the same limit, with room for that stop.
            max_run_minutes=job.max_run_minutes + 1 + math.ceil(2 * settings.STOP_GRACE_PERIOD / 60) if job.max_run_minutes else None,
            grace_s=int(settings.STOP_GRACE_PERIOD),
            cpus=math.ceil(limits.cpus) if limits.cpus and not limits.cpus_default else None,
            memory_mb=limits.memory_mb if limits.memory_mb and not limits.memory_default else None,
            spot=job.job_type == TrainingJob.JobType.SPOT,
            requeue=False,  # a new attempt is the console's to place
            # sacct links the batch job to the console's job and user (DisableRootJobs aside, the
            # submitting Unix user is the console's service account).
            comment=f"satrain:job={job.pk}:attempt={attempt.number}:user={job.owner.get_username()}",
            # Root submits for the service account (``sbatch --uid``); a console run as that
            # account submits as itself.
            user=self.run_as.name if self.run_as is not None and os.geteuid() == 0 else None,
        )
        if self.accounts is not None:
            try:
                spec = replace(spec, project=self.accounts.ensure(job.project))
            except SlurmError as error:  # e.g. the console's user may not create accounts
                logger.warning("job %s: Slurm account of project %s not set (%s): submitted to the default account", job.pk, job.project.name, error)
        try:
            handle = self.scheduler.submit(spec)
        except SlurmError as error:
            raise OSError(f"Slurm refused the run: {error}") from error
        for part, _, _ in ranks:
            runs.part_submitted(part, handle)
            self.queued[part.pk] = Queued(part=part, handle=handle, workdir=workdir, resume_step=resume_step)
        logger.info("job %s: attempt %s (%s rank%s) queued in Slurm as job %s", job.pk, attempt.number, len(ranks), "s"[: len(ranks) > 1], handle)

    def signal(self, part: AttemptNode, sig: int) -> bool:
        """Through Slurm, on the run's node (its pid record's numbers are that node's, not this
        machine's), to the runner alone (the batch shell), which passes it on to the run as
        ``signal_run`` does: SIGTERM as itself, SIGKILL as SIGUSR1 (the runner outlives the run
        to pass on its last lines and record its exit; a runner not yet watching a run dies of
        it, and the cluster's Epilog removes any container). False where Slurm has no job for it
        or refuses."""
        if not part.backend_job:
            return False
        name = signal.Signals(sig).name.removeprefix("SIG")
        if part.attempt.job.node_count > 1:
            # The batch shell is ``srun``, which passes the signal on to every rank's runner: a
            # signal for each rank of the attempt (a stop's, a failover's) is sent once.
            sent = self.sent.setdefault(part.backend_job, set())
            if sig in sent:
                return True
            sent.add(sig)
            while len(self.sent) > 1000:
                del self.sent[next(iter(self.sent))]
        try:
            self.scheduler.client.cancel(int(part.backend_job), signal="USR1" if sig == signal.SIGKILL else name, full=False)
        except (SlurmError, ValueError) as error:
            logger.warning("job %s: %s to Slurm job %s failed: %s", part.attempt.job_id, name, part.backend_job, error)
            return False
        logger.info("job %s: sent SIG%s to attempt %s rank %s (Slurm job %s)", part.attempt.job_id, name, part.attempt.number, part.rank, part.backend_job)
        return True

    def cancel(self, handle: str) -> None:
        try:
            self.scheduler.client.cancel(int(handle))
        except SlurmError as error:
            logger.warning("Slurm job %s: cancel failed: %s", handle, error)


class SlurmRuns:
    """Slurm's run port (``agent.ports.RunPort``): what the agent keeps of its ranks between
    Slurm's records, when it reads them next, and what those records say of its nodes and ranks."""

    def __init__(self, launch: SlurmLaunch) -> None:
        self.launch = launch
        self.scheduler = launch.scheduler
        self.next_poll = 0.0  # monotonic: when Slurm's records are read next
        self.ending: dict[int, float] = {}  # AttemptNode id → when its exit record was first seen
        self.jobs: dict[str, AttemptObservation] = {}  # Slurm job id → what Slurm said last
        self.down: set[str] = set()  # nodes Slurm has DOWN

    def forget(self, part_id: int) -> None:
        self.ending.pop(part_id, None)

    def delay_hint(self) -> float | None:
        """Ranks queued or ending wait on Slurm's next records: the loop wakes by then (and
        reads the queued ranks' pid records at least every few output polls)."""
        if not (self.launch.queued or self.ending):
            return None
        return min(max(0.0, self.next_poll - time.monotonic()), settings.OUTPUT_POLL_INTERVAL * 5)

    def evidence_source(self) -> EvidenceSource:
        """Each node's kernel log reaches the health monitor through the files its own check
        writes (Slurm's ``HealthCheckProgram`` on the node: ``failover.nodecheck``), never this
        machine's kernel log."""
        return node_check_files()

    def start(self, agent: LoopView) -> None:
        """Ranks queued in Slurm by an earlier run of the console are watched again."""
        for part in queued_parts(agent.node_names):
            self.launch.queued.setdefault(
                part.pk,
                Queued(part=part, handle=part.backend_job, workdir=str(job_dir(part.attempt.job_id) / "work"), resume_step=spec_resume_step(run_dir(part))),
            )

    def beating(self, node_names: Sequence[str]) -> Sequence[str]:
        """Beats only for the nodes Slurm has up: one Slurm took as down is lost to the console too
        (``sweep_lost_nodes``), and Ready again once Slurm has it back."""
        return [name for name in node_names if name not in self.down]

    # --- Slurm's records -------------------------------------------------------------------
    def before_step(self, agent: LoopView) -> None:
        polled = False
        if time.monotonic() >= self.next_poll:
            self.next_poll = time.monotonic() + settings.SLURM_POLL_INTERVAL
            try:
                self.poll_slurm(agent)
                polled = True
            except SlurmError as error:
                logger.warning("agent %s: Slurm unavailable this round: %s", agent.name, error)
        if not polled:
            self.settle_queued(agent, slurm=False)  # a runner up since: its pid record (files only)

    def poll_slurm(self, agent: LoopView) -> None:
        # Jobs first, then nodes: Slurm marks a node DOWN before it ends the node's jobs NODE_FAIL,
        # so a job read as lost has its node read as down (read the other way round, a node that
        # went down between the two reads left a NODE_FAIL job on a node still up here, and its
        # run ended as a lost supervisor instead of a lost node).
        handles = [q.handle for q in self.launch.queued.values()] + [p.backend_job for p in agent.live.values() if p.backend_job]
        jobs = self.scheduler.observe(handles) if handles else {}
        self.mirror_nodes(agent, self.scheduler.nodes())
        self.jobs = jobs
        if self.launch.accounts is not None:
            try:
                self.launch.accounts.sync()
            except SlurmError as error:
                logger.warning("agent %s: Slurm accounts not updated this round: %s", agent.name, error)
        self.settle_queued(agent)

    def mirror_nodes(self, agent: LoopView, views: list[NodeView]) -> None:
        """Slurm's node states into ``Node.backend_state``; the console's health and cordons into
        Slurm's drains (with the fault's reason), and back once healthy."""
        by_name = {view.name: view for view in views}
        self.down = {view.name for view in views if "DOWN" in view.state}
        bad_gpus = dict(GPU.objects.filter(node__name__in=agent.node_names, healthy=False).exclude(health_reason="").values_list("node_id", "health_reason"))
        files = None if forced_simulation() else node_check_files()
        for node in Node.objects.filter(name__in=agent.node_names):
            view = by_name.get(node.name)
            if view is None:
                continue
            seen = files.gpus_seen(node.name) if files is not None else None
            facts = {
                # Whether its GPUs are real is the node's own check's word, once it has spoken.
                "simulated": node.simulated if seen is None else not seen,
                "backend_state": view.state[:64],
                "backend_reason": view.reason[:300],
                "backend_gpus_in_use": view.gpus_in_use,
                "cpu_count": view.cpus or node.cpu_count,
                "memory_mb": view.memory_mb or node.memory_mb,
                "address": view.address[:255] or node.address,
            }
            if any(getattr(node, name) != value for name, value in facts.items()):
                Node.objects.filter(pk=node.pk).update(**facts)
                if state_takes_work(node.backend_state) != state_takes_work(view.state) or "DOWN" in view.state:
                    wakeups.round_wanted()  # placement (or the lost-node sweep) has a new answer
            why = node.health_reason if not node.healthy else (bad_gpus.get(node.pk) or ("cordoned in the console" if node.cordoned else ""))
            drained = "DRAIN" in view.state
            try:
                if why and not drained and not node.health_reason.startswith("lost:"):
                    self.scheduler.drain(node.name, f"{DRAIN_PREFIX} {why}")
                    logger.warning("agent %s: node %s drained in Slurm: %s", agent.name, node.name, why)
                elif not why and drained and view.reason.startswith(DRAIN_PREFIX):
                    self.scheduler.resume(node.name)
                    logger.info("agent %s: node %s returned to service in Slurm", agent.name, node.name)
            except SlurmError as error:
                # The node changed state since it was read (a slurmd registering): next round.
                logger.warning("agent %s: node %s: %s (tried again next round)", agent.name, node.name, error)

    def settle_queued(self, agent: LoopView, *, slurm: bool = True) -> None:
        """Ranks Slurm has started are reported started (their runner wrote its pid record); with
        Slurm's records just read (``slurm``), the others show Slurm's reason, or end as Slurm
        ended them, or are cancelled if the console closed them meanwhile."""
        if not self.launch.queued:
            return
        closed: set[int] = set()
        if slurm:
            closed = set(AttemptNode.objects.filter(pk__in=list(self.launch.queued), ended_at__isnull=False).values_list("pk", flat=True))
        for pk, queued in list(self.launch.queued.items()):
            part = queued.part
            if pk in closed:  # stopped or deleted while queued
                del self.launch.queued[pk]
                self.launch.cancel(queued.handle)
                continue
            record = runfiles.read_pid(run_dir(part))
            if record is not None and record.runner_pid:
                del self.launch.queued[pk]
                node = record.node if record.node and record.node in agent.node_names else part.node.name
                gpus = list(record.gpus) if record.gpus is not None else list(part.gpu_indices)
                if (node, gpus) != (part.node.name, list(part.gpu_indices)):
                    logger.info(
                        "job %s: Slurm runs rank %s on %s GPUs %s, not %s GPUs %s", part.attempt.job_id, part.rank, node, gpus, part.node, part.gpu_indices
                    )
                # Slurm placed it: the console's holds follow, taken again even where they match
                # (another rank Slurm moved may have taken them meanwhile).
                runs.part_moved(part, node, gpus)
                if runs.part_started(part, runner_pid=record.runner_pid, workdir=queued.workdir, resume_step=queued.resume_step):
                    agent.live[part.pk] = part
                    part.attempt = JobAttempt.objects.select_related("job").get(pk=part.attempt_id)
                else:
                    self.launch.signal(part, signal.SIGKILL)
                    self.launch.cancel(queued.handle)
                continue
            seen = self.jobs.get(queued.handle) if slurm else None
            if seen is None:
                continue
            if seen.phase == "waiting" and seen.reason not in (queued.reason, "None", ""):
                queued.reason = seen.reason
                why = f"{seen.reason}: {REASONS[seen.reason]}" if seen.reason in REASONS else seen.reason or seen.state
                runs.queued_by_scheduler(part.attempt, f"queued in Slurm (job {queued.handle}): {why}")
            elif seen.phase in ("exited", "lost"):
                del self.launch.queued[pk]
                runs.launch_failed(part.attempt, f"Slurm ended job {queued.handle} before its run started: {seen.state} {seen.reason}".strip())

    # --- exits -----------------------------------------------------------------------------
    def runner_alive(self, part: AttemptNode, directory: Path) -> bool | None:
        """Whether the rank's batch job is still on, in Slurm's words: its runner's pid is the
        node's, not this machine's. Alive until Slurm's records say otherwise; a job lost with
        its node while Slurm has the node DOWN is the lost-node sweep's to end (it names the
        node's loss as the cause)."""
        if not part.backend_job:
            return None  # the agent's own check of its process
        seen = self.jobs.get(part.backend_job)
        if seen is None or seen.phase in ("waiting", "running") or runfiles.exit_written(directory):
            return True
        return seen.phase == "lost" and part.node.name in self.down

    def judge_end(self, part: AttemptNode, fact: Ended) -> Ended | None:
        """As on the agents, once Slurm has recorded how the batch job ended: a preemption is a
        Spot reclaim, a cancel or a time limit by Slurm says so, and a run whose runner left no
        exit record ended as Slurm recorded it (its exit code or signal). ``None``: not yet
        (Slurm's record is not final; asked again at a later collect)."""
        seen = self.jobs.get(part.backend_job) if part.backend_job else None
        first = self.ending.setdefault(part.pk, time.monotonic())
        if part.backend_job and (seen is None or seen.state not in FINAL) and time.monotonic() - first < FINAL_STATE_WAIT:
            self.next_poll = time.monotonic()  # Slurm's record read at the next step
            return None  # reported at a later collect, once Slurm's record is final
        self.ending.pop(part.pk, None)
        if seen is not None and seen.state == "PREEMPTED" and part.attempt.stop_requested_at is None:
            runs.preempted_by_scheduler(part.attempt, [part.node_id])
            # Slurm's word first: a runner killed at the end of the grace period left no exit record.
            below = "" if fact.plain else describe(fact)
            fact = Ended(EndKind.PREEMPTED, exit_code=fact.exit_code, exit_signal=fact.exit_signal, handle=part.backend_job, detail=below)
        elif seen is not None and seen.state in SLURM_ENDS and part.attempt.stop_requested_at is None and (fact.plain or lost_with_its_node(fact, seen.state)):
            reason = seen.reason if seen.reason and seen.reason != "None" else ""
            fact = Ended(
                SLURM_ENDS[seen.state], exit_code=fact.exit_code, exit_signal=fact.exit_signal, handle=part.backend_job, state=seen.state, detail=reason
            )
        elif fact.exit_code is None and fact.exit_signal is None and seen is not None and seen.state in FINAL and (seen.exit_signal or seen.exit_code):
            # The runner died with its run (a SIGKILL to the whole batch step: the health monitor's
            # kill, a stop's grace spent, anyone's scancel) and wrote no exit record: Slurm's
            # record says how the batch job ended.
            fact = Ended(EndKind.SUPERVISOR_LOST, exit_code=seen.exit_code, exit_signal=seen.exit_signal, handle=part.backend_job, state=seen.state)
        return fact


def lost_with_its_node(fact: Ended, state: str) -> bool:
    """A runner gone without an exit record from a batch job Slurm ended ``NODE_FAIL``: its node
    was lost (a node that went down and came back between two reads of Slurm's records)."""
    return fact.kind is EndKind.SUPERVISOR_LOST and state == "NODE_FAIL"


class SlurmEngine(Backend):
    """The engine of a Slurm cluster's nodes (in the embedded console: every node of the cluster),
    the agents' sibling (issue 44): it subclasses none of their classes but composes their loop
    (``agent.node_agent.NodeAgent``: launches, stops, output and exits) with Slurm's ports, its
    launcher (``agent.launch.Launcher``) handing each rank's runner to Slurm."""

    def __init__(self, node_names: list[str], *, name: str = "slurm", scheduler: SlurmScheduler | None = None) -> None:
        self.scheduler = scheduler or slurm_scheduler()
        self.slurm = SlurmLaunch(self.scheduler)
        self.slurm_runs = SlurmRuns(self.slurm)
        # The loop registers itself as the nodes' local agent (messages, plug-ins reach it).
        self.loop = NodeAgent(node_names, name=name, launcher=Launcher(node_names, port=self.slurm), port=self.slurm_runs)
        self.name = name
        self.node_names = self.loop.node_names
        self.wakeup = self.loop.wakeup

    # --- its loop (agent.loop) -------------------------------------------------------------
    def start(self) -> None:
        self.loop.start()

    def shutdown(self) -> None:
        self.loop.shutdown()

    def step(self) -> int:
        return self.loop.step()

    def tick(self) -> int:
        return self.loop.tick()

    def delay(self) -> float:
        return self.loop.delay()

    # --- messages (any thread) ---------------------------------------------------------------
    def wake(self) -> None:
        self.loop.wake()

    def request_launch(self, attempt_id: int) -> None:
        self.loop.request_launch(attempt_id)

    def launch_attempts(self, attempts: Sequence[JobAttempt]) -> None:
        self.loop.launch_attempts(attempts)

    # --- what plug-ins use (agent.plugins.AgentView) -----------------------------------------
    def live_parts(self) -> list[AttemptNode]:
        return self.loop.live_parts()

    def signal(self, part: AttemptNode, sig: int) -> bool:
        return self.loop.signal(part, sig)

    def evidence_source(self) -> EvidenceSource:
        return self.loop.evidence_source()


def spec_resume_step(directory: Path) -> int | None:
    """The checkpoint step a rank's spec resumes from (its ``CKPT_LAST_STEP``), or None."""
    try:
        value = runfiles.read_spec(directory / runfiles.SPEC_FILE).env.get("CKPT_LAST_STEP", "")
    except runfiles.SpecRefused:
        return None
    return int(value) if value.isdigit() and len(value) < 16 else None


def queued_parts(node_names) -> list[AttemptNode]:
    """Ranks handed to Slurm and not started (a restarted console finds them again)."""
    return list(
        AttemptNode.objects.filter(node__name__in=node_names, ended_at__isnull=True, runner_pid=runs.CLAIMED, attempt__state=JobAttempt.State.PLACED)
        .exclude(backend_job="")
        .select_related("attempt", "attempt__job", "node")
    )
