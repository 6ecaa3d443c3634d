"""Training Jobs, the projects they belong to, their attempts and events; nodes, GPUs and images."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import DurationField, ExpressionWrapper, F, OuterRef, Q, Subquery, Sum
from django.utils import timezone

from jobs.job_fields import dns_label_problems
from jobs.secret_env import SecretEnv, SecretEnvField, SecretUnreadable, no_secrets
from jobs.statuses import ACTIVE, BADGE_GROUPS, JobStatus

DNS_LABEL = RegexValidator(
    r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
    "Use at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit.",
)


def validate_job_name(name: str) -> None:
    """A job's name is a lowercase DNS label; every problem is named (which character, where)."""
    problems = dns_label_problems(name)
    if problems:
        raise ValidationError(problems, code="invalid")


class ProjectQuerySet(models.QuerySet):
    def for_user(self, user) -> ProjectQuerySet:
        if user.is_staff:
            return self.all()
        return self.filter(members=user)


class Project(models.Model):
    """Jobs belong to a project; its members see and act on its jobs."""

    name = models.CharField(max_length=63, unique=True, validators=[DNS_LABEL])
    description = models.CharField(max_length=200, blank=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="training_projects", blank=True)
    personal_for = models.OneToOneField(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="personal_project")
    created_at = models.DateTimeField(default=timezone.now)
    # Sharing the cluster (docs/quotas.md): what the project is guaranteed, what it may borrow.
    gpu_quota = models.PositiveIntegerField(default=0, help_text="GPUs guaranteed to the project: its On-Demand jobs within it make Spot jobs yield.")
    gpu_borrow_limit = models.PositiveIntegerField(
        null=True, blank=True, help_text="GPUs it may borrow beyond its quota while they are idle; empty: no limit, 0: none."
    )
    cpu_job_limit = models.PositiveIntegerField(
        null=True, blank=True, help_text="Concurrent CPU-only (0-GPU) jobs; empty: the QUEUE_CPU_JOBS_PER_PROJECT setting."
    )
    multi_node_host_network = models.BooleanField(
        default=False,
        help_text="Ranks of one job on different hosts may use their hosts' network for their rendezvous (docs/security.md: "
        "they then reach the hosts' services). Off: a multi-node job runs only where its ranks share one host, each job "
        "in a network of its own.",
    )
    # What a job's network reaches beyond its own ranks (docs/security.md, "Networks").
    egress = models.CharField(
        max_length=10,
        blank=True,
        choices=[
            ("", "platform default (JOB_EGRESS)"),
            ("none", "none: its own ranks only"),
            ("outbound", "outbound: the internet, never the node or private ranges"),
        ],
        default="",
        help_text="Where this project's jobs may connect besides their own ranks.",
    )
    storage_limit_gib = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Disk the project's running jobs may use together (work, output and container layers, GiB); empty: no project total.",
    )
    # Fair share: GPU-seconds used, decayed with QUEUE_USAGE_HALF_LIFE, as of usage_at (placement writes it).
    usage_gpu_seconds = models.FloatField(default=0.0, editable=False)
    usage_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = ProjectQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def effective_egress(self) -> str:
        """``none`` or ``outbound``: the project's choice, else the platform's (JOB_EGRESS)."""
        return self.egress or (settings.JOB_EGRESS if settings.JOB_EGRESS in ("none", "outbound") else "none")


class ProjectVolume(models.Model):
    """A host directory an operator maps into a project's jobs, at the same path."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="volumes")
    path = models.CharField(max_length=500, help_text="Absolute host path, e.g. /data/imagenet; jobs see it at the same path.")
    read_only = models.BooleanField(default=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "path"], name="volume_project_path")]

    def __str__(self) -> str:
        return f"{self.path} ({'ro' if self.read_only else 'rw'})"

    def clean(self) -> None:
        if not self.path.startswith("/") or ".." in self.path.split("/"):
            raise ValidationError({"path": "Use an absolute host path without '..'."})


IMAGE_REFERENCE = RegexValidator(
    r"^(?:[A-Za-z0-9.-]+(?::[0-9]{1,5})?/)?[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$",
    "Use an OCI image reference: [registry/]repository[:tag][@sha256:digest], e.g. nvcr.io/nvidia/pytorch:24.05-py3.",
)


class Image(models.Model):
    """An image users are offered on the form: an OCI reference the nodes pull (a name without a
    registry is looked up in ``DEFAULT_REGISTRY``)."""

    reference = models.CharField(
        max_length=255,
        unique=True,
        validators=[IMAGE_REFERENCE],
        help_text="[registry/]repository[:tag][@sha256:…], as the job's Image field names it",
    )
    description = models.CharField(max_length=200, blank=True)
    is_default = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["reference"]

    def __str__(self) -> str:
        return self.reference


class Registry(models.Model):
    """A container registry the nodes pull from (``host[:port]``)."""

    host = models.CharField(
        max_length=255,
        unique=True,
        validators=[RegexValidator(r"^[A-Za-z0-9.-]+(?::[0-9]{1,5})?$", "Use host or host:port, e.g. nvcr.io or 10.0.0.5:5000.")],
    )
    description = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["host"]
        verbose_name_plural = "registries"

    def __str__(self) -> str:
        return self.host


class RegistryCredential(models.Model):
    """Credentials for pulls from a registry, for one project's jobs (or, with no project, every
    project's). Never shown back, never in a job's environment or log: the agent hands them to the
    pull as an auth file only it can read.

    The password is stored encrypted as secret environment variables are (``jobs.secret_env``: a
    key derived from SECRET_KEY), as the one secret value ``password``; ``password`` reads and
    sets it in the clear (``RegistryCredential(password=...)`` works) and raises
    ``SecretUnreadable`` when the key that encrypted it is gone."""

    registry = models.ForeignKey(Registry, on_delete=models.CASCADE, related_name="credentials")
    project = models.ForeignKey("Project", null=True, blank=True, on_delete=models.CASCADE, related_name="registry_credentials")
    username = models.CharField(max_length=200)
    password_encrypted = SecretEnvField(db_column="password", default=no_secrets, blank=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["registry", "project"], name="one_credential_per_registry_and_project")]

    def __str__(self) -> str:
        return f"{self.username}@{self.registry.host}" + (f" for {self.project}" if self.project_id else "")

    @property
    def password(self) -> str:
        """The password or token, decrypted: for the pull's auth file only."""
        return self.password_encrypted.reveal().get("password", "")

    @password.setter
    def password(self, value: str) -> None:
        self.password_encrypted = SecretEnv.of({"password": value})

    def readable_password(self) -> str | None:
        """The password decrypted, or None when the console's key cannot decrypt it (SECRET_KEY
        changed without a fallback): for the pull's auth file only."""
        try:
            return self.password
        except SecretUnreadable:
            return None


class Node(models.Model):
    class State(models.TextChoices):
        READY = "Ready", "Ready"
        NOT_READY = "NotReady", "NotReady"

    name = models.CharField(max_length=63, unique=True, validators=[DNS_LABEL])
    gpu_model = models.CharField(max_length=100, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.READY)
    healthy = models.BooleanField(default=True)
    health_reason = models.CharField(max_length=300, blank=True)
    # When node-side evidence made it unhealthy (None while healthy): waiting jobs say since when.
    unhealthy_since = models.DateTimeField(null=True, blank=True)
    cordoned = models.BooleanField(default=False)
    # A cluster backend's own view of the node (Slurm: "IDLE", "MIXED+DRAIN", "DOWN*") and its
    # reason; empty on the console's own agents. Placement skips a node its backend drained or lost.
    backend_state = models.CharField(max_length=64, blank=True)
    backend_reason = models.CharField(max_length=300, blank=True)
    # GPUs the cluster's scheduler has allocated on the node, to anyone's work (None: no scheduler).
    backend_gpus_in_use = models.PositiveSmallIntegerField(null=True, blank=True)
    simulated = models.BooleanField(default=False)
    agent = models.CharField(max_length=100, blank=True, help_text="The node agent that serves this node")
    address = models.CharField(max_length=255, default="127.0.0.1", help_text="Where ranks reach this node (MASTER_ADDR)")
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    # Spot capacity on this node was reclaimed: no Spot job is placed here until then.
    spot_reclaimed_until = models.DateTimeField(null=True, blank=True)
    # The machine's size and whether runs on it get their CPU and memory limits (a cgroup each),
    # as its agent found at registration; ``limits_note`` says how, or why not.
    cpu_count = models.PositiveIntegerField(null=True, blank=True)
    memory_mb = models.PositiveIntegerField(null=True, blank=True)
    limits_enforced = models.BooleanField(default=False)
    limits_note = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def schedulable(self) -> bool:
        return self.state == self.State.READY and self.healthy and not self.cordoned


class GPU(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=100, blank=True)
    model = models.CharField(max_length=100, blank=True)
    memory_mb = models.PositiveIntegerField(default=0)
    healthy = models.BooleanField(default=True)
    health_reason = models.CharField(max_length=300, blank=True)
    unhealthy_since = models.DateTimeField(null=True, blank=True)
    # The placement that holds this GPU; set and cleared by compare-and-swap in placement.
    allocated_to = models.ForeignKey("AttemptNode", null=True, blank=True, on_delete=models.SET_NULL, related_name="gpus")

    class Meta:
        ordering = ["node__name", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_index_per_node")]
        verbose_name = "GPU"

    def __str__(self) -> str:
        return f"{self.node.name}/gpu{self.index}"


class CodeBundle(models.Model):
    """A user's code directory, packed (a gzipped tar of files and directories only: no links,
    ``jobs.services.bundles``); runs of its jobs find it unpacked in their work directory. Its
    owner and its project's members use it; a job, its failovers and its clones share it."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="code_bundles")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="code_bundles")
    sha256 = models.CharField(max_length=64)
    archive = models.BinaryField()
    size = models.PositiveBigIntegerField(help_text="The packed archive's bytes")
    unpacked_size = models.PositiveBigIntegerField()
    files = models.PositiveIntegerField()
    source = models.CharField(max_length=200, blank=True, help_text="Where it came from (the uploaded name)")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "sha256"], name="bundle_unique_per_project")]

    def __str__(self) -> str:
        return f"bundle {self.pk} ({self.sha256[:12]})"


class TrainingJobQuerySet(models.QuerySet):
    def visible_to(self, user) -> TrainingJobQuerySet:
        """Staff see every job; a user sees the jobs of the projects they are a member of."""
        if not user.is_authenticated:
            return self.none()
        if user.is_staff:
            return self.all()
        # A subquery, not a join: no duplicate rows, so no DISTINCT over a large table.
        member_of = Project.objects.filter(members=user).values("pk")
        return self.filter(Q(owner=user) | Q(project__in=member_of))

    def active(self) -> TrainingJobQuerySet:
        return self.filter(status__in=ACTIVE)

    def with_run_time(self) -> TrainingJobQuerySet:
        """Annotate what ``running_time`` reads (``run_ended``, ``run_open_since``), so a page of jobs
        gets its running times without a query per job: two subqueries, evaluated per row returned."""
        started = JobAttempt.objects.filter(job=OuterRef("pk"), started_at__isnull=False).order_by()
        ended = (
            started.filter(ended_at__isnull=False)
            .values("job")
            .annotate(total=Sum(ExpressionWrapper(F("ended_at") - F("started_at"), output_field=DurationField())))
            .values("total")
        )
        open_since = started.filter(ended_at__isnull=True).order_by("-number").values("started_at")[:1]
        return self.annotate(
            run_ended=Subquery(ended, output_field=DurationField()),
            run_open_since=Subquery(open_since, output_field=models.DateTimeField()),
        )


@dataclass(frozen=True)
class RunClock:
    """How long a job's attempts ran: ``ran`` in all, plus, while the job is Running, the time
    since ``running_since`` (the start of the attempt that runs now). Pages count on from it."""

    ran: timedelta
    running_since: datetime | None

    @property
    def ran_seconds(self) -> float:
        return self.ran.total_seconds()

    def total(self, now: datetime) -> timedelta:
        if self.running_since is None:
            return self.ran
        return self.ran + max(now - self.running_since, timedelta(0))

    @property
    def so_far(self) -> timedelta:
        return self.total(timezone.now())


def run_clock_of(*, status: str, finished_at: datetime | None, ended: timedelta | None, open_since: datetime | None, now: datetime) -> RunClock | None:
    """The clock of a job from the time its ended attempts ran and the start of the one still open
    (None: no attempt has started). Time between attempts (Pending, failover) is not counted; an
    attempt left open by a finished job counts until the job finished."""
    if ended is None and open_since is None:
        return None
    ran = max(ended or timedelta(0), timedelta(0))
    if open_since is None:
        return RunClock(ran, None)
    if status == JobStatus.RUNNING and finished_at is None:
        return RunClock(ran, open_since)
    return RunClock(ran + max((finished_at or now) - open_since, timedelta(0)), None)


class TrainingJob(models.Model):
    class JobType(models.TextChoices):
        ON_DEMAND = "On-Demand", "On-Demand"
        SPOT = "Spot", "Spot"

    name = models.CharField(max_length=63, validators=[validate_job_name])
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="training_jobs")
    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="jobs")
    job_type = models.CharField(max_length=16, choices=JobType.choices, default=JobType.ON_DEMAND)
    image = models.CharField(max_length=200)
    command = models.TextField()
    env = models.JSONField(default=dict, blank=True)
    # Encrypted with a key derived from SECRET_KEY (``jobs.secret_env``): names readable, values
    # only to the run's environment; every page, the API and the admin show them as ••••.
    secret_env = SecretEnvField(default=no_secrets, blank=True, editable=False)
    gpus_per_node = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(0), MaxValueValidator(64)])
    node_count = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1), MaxValueValidator(64)])
    failover_enabled = models.BooleanField(default=True)
    # Checkpointless failover: every step's state in memory, replicated to another node (agent.checkpointless).
    checkpointless = models.BooleanField(default=True)
    output_dir = models.CharField(max_length=500, blank=True)
    max_run_minutes = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    # Per node the job runs on (None: the node's default, JOB_DEFAULT_CPUS / JOB_DEFAULT_MEMORY_MB).
    cpu_limit = models.FloatField(null=True, blank=True, help_text="CPU cores per node")
    memory_limit_mb = models.PositiveIntegerField(null=True, blank=True, help_text="Memory per node, MiB")
    description = models.CharField(max_length=500, blank=True)
    code = models.ForeignKey(CodeBundle, null=True, blank=True, on_delete=models.PROTECT, related_name="jobs")
    # A warm start: the run begins from this job's committed checkpoint at this step.
    warm_start_job = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="warm_starts")
    warm_start_step = models.BigIntegerField(null=True, blank=True)
    # Within its project's turn in the fair-share queue, higher goes first (then the older job).
    priority = models.SmallIntegerField(default=0, validators=[MinValueValidator(-100), MaxValueValidator(100)])

    status = models.CharField(max_length=32, choices=JobStatus.choices, default=JobStatus.PENDING, db_index=True)
    status_reason = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    failover_count = models.PositiveSmallIntegerField(default=0)
    # Image-pull retries: when the next try is due and how many were made.
    pull_attempts = models.PositiveSmallIntegerField(default=0)
    next_retry_at = models.DateTimeField(null=True, blank=True)

    objects = TrainingJobQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="job_name_unique_per_owner")]
        indexes = [
            models.Index(fields=["status", "created_at"], name="job_status_created"),
            # The fair-share queue reads each project's and shape's head of line through this.
            models.Index(fields=["status", "project", "gpus_per_node", "node_count", "priority", "created_at"], name="job_queue_line"),
            # The list reads each access branch (own jobs, each project's) newest first off these,
            # and per status when filtered (console.paging.list_branches): a page costs its rows.
            # The last column is the other half of visible_to's "owner OR project", so a branch's
            # rows are counted off the index alone (console.paging.capped_count), no row read.
            models.Index(fields=["owner", "created_at", "id", "project"], name="job_owner_created"),
            models.Index(fields=["project", "created_at", "id", "owner"], name="job_project_created"),
            models.Index(fields=["owner", "status", "created_at", "id", "project"], name="job_owner_status_created"),
            models.Index(fields=["project", "status", "created_at", "id", "owner"], name="job_project_status_created"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * self.node_count

    @property
    def badge(self) -> tuple[str, str]:
        return BADGE_GROUPS[self.status]

    @property
    def run_clock(self) -> RunClock | None:
        """Read from ``with_run_time``'s annotations when the queryset had them, else one query."""
        if "run_ended" in self.__dict__:
            ended, open_since = self.__dict__["run_ended"], self.__dict__.get("run_open_since")
        else:
            found = TrainingJob.objects.filter(pk=self.pk).with_run_time().values_list("run_ended", "run_open_since").first()
            ended, open_since = found or (None, None)
        return run_clock_of(status=self.status, finished_at=self.finished_at, ended=ended, open_since=open_since, now=timezone.now())

    @property
    def running_time(self) -> timedelta | None:
        """The time the job's attempts ran (the sum over its attempts that started), not the wall
        time since it first started: it stands still while the job waits between attempts."""
        clock = self.run_clock
        return None if clock is None else clock.so_far

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE


class JobAttempt(models.Model):
    """One placement of a job: on one or more nodes, from launch to exit."""

    class State(models.TextChoices):
        PLACED = "placed", "placed"  # GPUs held, process not started yet
        RUNNING = "running", "running"
        EXITED = "exited", "exited"
        ABANDONED = "abandoned", "abandoned"  # never started (image missing, launch error)

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveSmallIntegerField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.PLACED)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    exit_signal = models.IntegerField(null=True, blank=True)
    cause = models.CharField(max_length=500, blank=True)
    # How the run ended (jobs.backends.facts.EndKind), written with ``cause``, its words; "" until then.
    end_kind = models.CharField(max_length=24, blank=True)
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    # Stopped because an operator reclaimed spot capacity: the job goes back to Pending.
    reclaimed = models.BooleanField(default=False)
    # Preempted (a Spot run yielding its GPUs) for this On-Demand job within its project's quota.
    preempted_for = models.ForeignKey("TrainingJob", null=True, blank=True, on_delete=models.SET_NULL, related_name="preemptions")
    # The failover judgement of a failed run: "hardware" | "non-hardware" ("" until judged).
    verdict = models.CharField(max_length=16, blank=True)
    verdict_reason = models.CharField(max_length=500, blank=True)
    evidence = models.JSONField(default=dict, blank=True)
    judged_at = models.DateTimeField(null=True, blank=True)
    # CKPT_LAST_STEP the run was started with (None: started from scratch).
    resume_step = models.BigIntegerField(null=True, blank=True)
    # Where that step came from ("disk", "replica", "warm start"; "" from scratch) and what was
    # lost or refused on the way, as the Failover tab and the log banner say it.
    resume_source = models.CharField(max_length=16, blank=True)
    resume_detail = models.CharField(max_length=500, blank=True)
    # The image this attempt ran, by digest (repository@sha256:…): a failover runs the same one.
    image_digest = models.CharField(max_length=400, blank=True)
    # Where the ranks of a multi-node run meet (rank 0's node), fixed at placement.
    master_addr = models.CharField(max_length=255, default="127.0.0.1")
    master_port = models.PositiveIntegerField(default=29500)

    class Meta:
        ordering = ["job", "number"]
        constraints = [models.UniqueConstraint(fields=["job", "number"], name="attempt_unique_number")]

    def __str__(self) -> str:
        return f"{self.job.name}#{self.number}"


class AttemptNode(models.Model):
    """The part of an attempt on one node: its rank, GPUs and the process supervising it."""

    attempt = models.ForeignKey(JobAttempt, on_delete=models.CASCADE, related_name="placements")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="placements")
    rank = models.PositiveSmallIntegerField(default=0)
    gpu_indices = models.JSONField(default=list)
    workdir = models.CharField(max_length=500, blank=True)
    # None: not launched; 0: an agent claimed it and is starting it; > 0: its supervisor's pid.
    runner_pid = models.IntegerField(null=True, blank=True)
    # The backend's handle of this rank's run (Slurm: the batch job's id); empty on the agents.
    backend_job = models.CharField(max_length=64, blank=True)
    pgid = models.IntegerField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    exit_signal = models.IntegerField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["attempt", "rank"]
        constraints = [models.UniqueConstraint(fields=["attempt", "rank"], name="attempt_node_unique_rank")]

    def __str__(self) -> str:
        return f"{self.attempt} rank {self.rank} on {self.node.name}"

    @property
    def stream(self) -> str:
        return "master" if self.rank == 0 else f"worker-{self.rank}"


class JobEventQuerySet(models.QuerySet):
    def status_changes(self) -> JobEventQuerySet:
        """Leave out the entries that only record a new reason for the same status."""
        return self.exclude(from_status=models.F("to_status"))


class JobEvent(models.Model):
    """One entry of a job's history: a status change (from, to), or a new reason for the same
    status (from == to: placed, waiting for GPUs, a failover counted); why, during which attempt,
    when and by whom."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="events")
    from_status = models.CharField(max_length=32, choices=JobStatus.choices, blank=True)
    to_status = models.CharField(max_length=32, choices=JobStatus.choices)
    reason = models.CharField(max_length=500, blank=True)
    attempt = models.PositiveSmallIntegerField(null=True, blank=True)
    actor = models.CharField(max_length=150, default="system")
    evidence = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    objects = JobEventQuerySet.as_manager()

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["job", "created_at"], name="event_job_created")]

    def __str__(self) -> str:
        return f"{self.job_id}: {self.from_status or '∅'} → {self.to_status}"


class JobExclusion(models.Model):
    """A node (or, with FAILOVER_EXCLUDE=gpu, one GPU of it) a job is never placed on again."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="exclusions")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+")
    gpu = models.PositiveSmallIntegerField(null=True, blank=True, help_text="empty: the whole node")
    reason = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "node", "gpu"], name="exclusion_unique")]


class ResourceSample(models.Model):
    """What a job's run used over ``span_s`` seconds ending at ``ts``, as its node agent sampled it:
    the mean utilisation and the summed memory and power of the job's GPUs, and its processes'
    host CPU and memory. Older samples are merged pairwise (``jobs.services.samples``), so a job
    keeps at most a few hundred rows however long it runs: recent ones fine, older ones coarse."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="resource_samples")
    attempt = models.PositiveSmallIntegerField()
    ts = models.DateTimeField()
    span_s = models.FloatField(default=0.0)
    gpu_util = models.FloatField(null=True, blank=True)  # percent, mean over the job's GPUs
    gpu_mem_mb = models.FloatField(null=True, blank=True)  # MiB in use, summed over the job's GPUs
    power_w = models.FloatField(null=True, blank=True)  # watts, summed over the job's GPUs
    cpu_percent = models.FloatField(null=True, blank=True)  # of one core (200 = two cores busy)
    host_mem_mb = models.FloatField(null=True, blank=True)  # resident memory of the job's processes

    class Meta:
        indexes = [models.Index(fields=["job", "ts"], name="resource_sample_job_ts")]
