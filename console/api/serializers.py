"""Serializers of the REST API: Training Jobs (read and create), their events, attempts and logs;
nodes; and the query parameters of the list and log endpoints.

They parse and check input only; creating, stopping and cloning jobs is left to the services.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.utils.functional import cached_property
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from agent.resume import warm_start_step
from console.estimate import estimate
from jobs.job_fields import CommandError, EnvRefused, normalize_newlines, text_refusal, validate_command, validate_env
from jobs.models import GPU, AttemptNode, CodeBundle, JobAttempt, JobEvent, Node, Project, TrainingJob, validate_job_name
from jobs.secret_env import MASK, SecretEnv, split_secrets
from jobs.services.bundles import usable_by
from jobs.services.creation import JOB_SETTINGS, JobSettingsRefused, check_settings
from jobs.services.images import validate_reference
from jobs.services.limits import limits_of
from jobs.statuses import WAITING, JobStatus
from logs.queries import STREAM_NAME, is_stream_name

# The largest value a signed 64-bit column holds: bigger numbers in a query are refused, not sent.
MAX_DB_INT = 2**63 - 1
# Portable across SQLite and PostgreSQL (an ``integer`` column there).
MAX_RUN_MINUTES = 2**31 - 1
ORDERINGS = ("name", "-name", "created_at", "-created_at", "status", "-status")


class TextField(serializers.CharField):
    """A CharField that takes only JSON strings (a number is a mistake here, not a name) that can
    be stored and handed to a run: no NUL, no lone surrogate."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        why = text_refusal(data)
        if why:
            raise serializers.ValidationError(f"This field {why}.")
        return super().to_internal_value(normalize_newlines(data))


@extend_schema_field({"type": "object", "additionalProperties": {"type": "string"}, "example": {"HF_DATASETS_OFFLINE": "1"}})
class EnvField(serializers.JSONField):
    """Environment variables as ``{NAME: value}``; numbers are accepted and stored as text."""

    def to_internal_value(self, data: Any) -> dict[str, str]:
        try:
            return validate_env(data)
        except EnvRefused as exc:
            raise serializers.ValidationError(exc.problems) from None


LIMITS_SCHEMA = {
    "type": "object",
    "properties": {
        "cpus": {"type": "number", "nullable": True, "description": "CPU cores per node; null: no limit"},
        "memory_mb": {"type": "integer", "nullable": True, "description": "MiB per node; null: no limit"},
        "text": {"type": "string", "example": "0.5 CPU cores, 2 GiB memory (default)"},
    },
    "required": ["cpus", "memory_mb", "text"],
}


QUEUE_SCHEMA = {
    "type": "object",
    "nullable": True,
    "properties": {
        "place": {"type": "integer", "nullable": True, "description": "1: first of its shape in line; null: not known yet"},
        "seconds": {"type": "integer", "nullable": True, "description": "from now until it may start; null: no estimate"},
        "text": {"type": "string", "example": "It may start in about 12 minutes (1 job of its shape ahead), …"},
    },
    "required": ["place", "seconds", "text"],
}


class TrainingJobSerializer(serializers.ModelSerializer):
    """A Training Job: the fields a user sets when creating it, and what the platform reports."""

    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.CharField: TextField,
        models.TextField: TextField,
    }

    project = serializers.PrimaryKeyRelatedField(
        queryset=Project.objects.none(),
        required=False,
        allow_null=True,
        help_text="Project id; defaults to your personal project. You must be a member of it.",
        error_messages={
            "does_not_exist": "Project {pk_value} does not exist or you are not a member of it.",
            "incorrect_type": "Give the project's id (an integer).",
        },
    )
    project_name = serializers.CharField(source="project.name", read_only=True)
    code = serializers.PrimaryKeyRelatedField(
        queryset=CodeBundle.objects.none(),
        required=False,
        allow_null=True,
        help_text="A code bundle's id (POST /api/v1/code-bundles/): the run finds its files in its work directory, /job/work.",
        error_messages={
            "does_not_exist": "Code bundle {pk_value} does not exist or you may not use it.",
            "incorrect_type": "Give the code bundle's id (an integer).",
        },
    )
    warm_start_job = serializers.PrimaryKeyRelatedField(
        queryset=TrainingJob.objects.none(),
        required=False,
        allow_null=True,
        help_text="Start from a committed checkpoint of this job (one you may see); with warm_start_step, else its newest.",
        error_messages={
            "does_not_exist": "Job {pk_value} does not exist or you may not see it.",
            "incorrect_type": "Give the job's id (an integer).",
        },
    )
    warm_start_step = serializers.IntegerField(
        required=False, allow_null=True, min_value=0, max_value=MAX_DB_INT, help_text="The step of warm_start_job's checkpoint; null: its newest."
    )
    owner = serializers.CharField(source="owner.username", read_only=True)
    image = TextField(
        max_length=255,
        required=False,
        # Any reference the project may pull: a failed pull waits in imagepullbackoff with the
        # registry's words; only a registry the platform certainly does not know is refused here.
        validators=[validate_reference],
        help_text="OCI image reference ([registry/]repository[:tag][@sha256:…]); defaults to the console's default image.",
    )
    name = TextField(validators=[validate_job_name], help_text="Lowercase DNS label (at most 63 characters), unique among your jobs.")
    env = EnvField(
        required=False,
        help_text=f"Environment variables for the run, as NAME: value. Secret ones (see secret_env) read {MASK}; "
        "names ending in _TOKEN, _KEY, _PASSWORD or _SECRET are secret wherever they are given.",
    )
    secret_env = EnvField(
        required=False,
        write_only=True,
        help_text=f"Secret variables for the run, as NAME: value: stored encrypted, never returned (env shows them as {MASK}).",
    )
    max_run_minutes = serializers.IntegerField(
        min_value=1,
        max_value=MAX_RUN_MINUTES,
        required=False,
        allow_null=True,
        help_text="Stop the job after this many minutes of running.",
    )
    cpu_limit = serializers.FloatField(
        required=False,
        allow_null=True,
        help_text="CPU cores per node, e.g. 0.5 or 4 (at most the largest node's); null: the node's default.",
    )
    memory_limit_mb = serializers.IntegerField(
        required=False,
        allow_null=True,
        max_value=MAX_RUN_MINUTES,
        help_text="Memory per node in MiB (at least 32, at most the largest node's); null: the node's default. "
        "A run that needs more is killed and the job fails with 'out of memory'.",
    )
    limits = serializers.SerializerMethodField(help_text="The limits each run gets: the request, else the default.")
    status = serializers.ChoiceField(choices=JobStatus.choices, read_only=True, help_text="The exact status text.")
    failover_attempts = serializers.SerializerMethodField(help_text='Failovers used of the allowed, e.g. "1/3".')
    running_time_seconds = serializers.SerializerMethodField(
        help_text="How long the job's attempts ran in all (not the time it waited between them); null until one started."
    )
    total_gpus = serializers.IntegerField(read_only=True)
    queue = serializers.SerializerMethodField(
        help_text="A waiting job's place in line and when it may start, estimated from the running jobs' progress and "
        "run limits: {place, seconds, text}; null for a job that is not waiting."
    )

    class Meta:
        model = TrainingJob
        fields = [
            "id",
            "name",
            "owner",
            "project_name",
            *JOB_SETTINGS,
            "total_gpus",
            "limits",
            "status",
            "status_reason",
            "created_at",
            "started_at",
            "finished_at",
            "failover_count",
            "failover_attempts",
            "running_time_seconds",
            "queue",
        ]
        read_only_fields = ["status_reason", "created_at", "started_at", "finished_at", "failover_count"]
        extra_kwargs = {
            "command": {"help_text": "Launcher command, e.g. `python train.py` after VAR=value assignments."},
            "output_dir": {
                "help_text": "Where the training writes (checkpoints go below it): a folder in the project's data directory (a relative path is placed there) or a writable project volume; empty: the job's own."
            },
        }

    @cached_property
    def _readable_fields(self) -> list[serializers.Field]:
        # DRF's walks every field to skip the write-only ones, for each job of a page: once here
        # (a list of 100 jobs spent a quarter of its serialising there).
        return [field for field in self.fields.values() if not field.write_only]

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        request = self.context.get("request")
        if request is not None and request.user.is_authenticated:
            fields["project"].queryset = Project.objects.for_user(request.user)
            fields["code"].queryset = usable_by(request.user)
            fields["warm_start_job"].queryset = TrainingJob.objects.visible_to(request.user)
        return fields

    def get_failover_attempts(self, job: TrainingJob) -> str:
        return f"{job.failover_count}/{settings.MAX_FAILOVERS}"

    @extend_schema_field(LIMITS_SCHEMA)
    def get_limits(self, job: TrainingJob) -> dict[str, Any]:
        limits = limits_of(job)
        return {"cpus": limits.cpus, "memory_mb": limits.memory_mb, "text": limits.describe()}

    @extend_schema_field(QUEUE_SCHEMA)
    def get_queue(self, job: TrainingJob) -> dict[str, Any] | None:
        if job.status not in WAITING:
            return None
        known = self.context.get("queue_estimates")
        found = known.get(job.pk) if known is not None else estimate(job)
        return found.as_dict() if found is not None else None

    def get_running_time_seconds(self, job: TrainingJob) -> int | None:
        running = job.running_time
        return None if running is None else int(running.total_seconds())

    def validate_command(self, value: str) -> str:
        try:
            validate_command(value)
        except CommandError as exc:
            raise serializers.ValidationError(str(exc)) from None
        return value

    def to_representation(self, instance: TrainingJob) -> dict[str, Any]:
        data = super().to_representation(instance)
        secrets = TrainingJob._meta.get_field("secret_env").to_python(instance.secret_env)
        data["env"] = {**(instance.env or {}), **secrets.masked()}
        return data

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        plain, secrets = split_secrets(data.get("env") or {}, data.get("secret_env"))
        masked = sorted(name for name, value in secrets.items() if value == MASK)
        if masked:
            raise serializers.ValidationError(
                {
                    "secret_env": [
                        f"Give the value of {', '.join(masked)}: secrets are never returned, so {MASK} is not a value (POST …/clone/ keeps a job's secrets)."
                    ]
                }
            )
        data["env"], data["secret_env"] = plain, SecretEnv.of(secrets)
        if data.get("warm_start_job") is not None:
            try:
                data["warm_start_step"] = warm_start_step(data["warm_start_job"], data.get("warm_start_step"))
            except ValueError as exc:
                raise serializers.ValidationError({"warm_start_step": [str(exc)]}) from None
        elif data.get("warm_start_step") is not None:
            raise serializers.ValidationError({"warm_start_job": ["Name the job whose checkpoint to start from."]})
        try:
            # The settings a job may have are the creation service's to judge (every route's).
            return check_settings(data, owner=self.context["request"].user)
        except JobSettingsRefused as exc:
            raise serializers.ValidationError(exc.problems) from None

    def validate_name(self, value: str) -> str:
        owner = self.context["request"].user
        if TrainingJob.objects.filter(owner=owner, name=value).exists():
            raise serializers.ValidationError(f"You already have a job named {value}.")
        return value

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        fields = super().to_internal_value(data)
        fields.setdefault("image", settings.DEFAULT_IMAGE)
        return fields


class CloneRequestSerializer(serializers.Serializer):
    name = TextField(
        required=False,
        validators=[validate_job_name],
        help_text="Name of the new job; defaults to <name>-copy (then -copy-2, …).",
    )

    def validate_name(self, value: str) -> str:
        owner = self.context["request"].user
        if TrainingJob.objects.filter(owner=owner, name=value).exists():
            raise serializers.ValidationError(f"You already have a job named {value}.")
        return value


class JobEventSerializer(serializers.ModelSerializer):
    # Plain text, not an enum: the creation event has an empty ``from_status``.
    from_status = serializers.CharField(read_only=True)
    to_status = serializers.CharField(read_only=True)

    class Meta:
        model = JobEvent
        fields = ["id", "from_status", "to_status", "reason", "attempt", "actor", "created_at"]
        read_only_fields = fields


class PlacementSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name", read_only=True)
    stream = serializers.CharField(read_only=True, help_text="The log stream of this part of the run.")
    gpu_indices = serializers.ListField(child=serializers.IntegerField(), read_only=True)

    class Meta:
        model = AttemptNode
        fields = ["node", "rank", "stream", "gpu_indices", "exit_code", "exit_signal", "ended_at"]
        read_only_fields = fields


class JobAttemptSerializer(serializers.ModelSerializer):
    nodes = serializers.SerializerMethodField(help_text="Names of the nodes the attempt ran on, by rank.")
    placements = PlacementSerializer(many=True, read_only=True)

    class Meta:
        model = JobAttempt
        fields = [
            "number",
            "state",
            "nodes",
            "placements",
            "created_at",
            "started_at",
            "ended_at",
            "exit_code",
            "exit_signal",
            "cause",
            "image_digest",
            "resume_step",
            "resume_source",
            "resume_detail",
        ]
        read_only_fields = fields

    def get_nodes(self, attempt: JobAttempt) -> list[str]:
        return [placement.node.name for placement in attempt.placements.all()]


class ResourceSampleSerializer(serializers.Serializer):
    attempt = serializers.IntegerField()
    ts = serializers.DateTimeField(help_text="The end of the sampled span.")
    span_s = serializers.FloatField(help_text="Seconds this sample covers (merged samples cover more).")
    gpu_util = serializers.FloatField(allow_null=True, help_text="GPU utilisation, %, mean over the job's GPUs.")
    gpu_mem_mb = serializers.FloatField(allow_null=True, help_text="GPU memory in use, MiB, summed over the job's GPUs.")
    power_w = serializers.FloatField(allow_null=True, help_text="GPU power, W, summed over the job's GPUs.")
    cpu_percent = serializers.FloatField(allow_null=True, help_text="Host CPU of the job's processes, % of one core.")
    host_mem_mb = serializers.FloatField(allow_null=True, help_text="Resident host memory of the job's processes, MiB.")


class LogLineSerializer(serializers.Serializer):
    seq = serializers.IntegerField()
    attempt = serializers.IntegerField()
    ts = serializers.DateTimeField()
    text = serializers.CharField()


class LogPageSerializer(serializers.Serializer):
    lines = LogLineSerializer(many=True)
    next_after = serializers.IntegerField(allow_null=True, help_text="The last line's seq: pass it as `after` for the next page; null if no lines.")
    has_more = serializers.BooleanField(help_text="More lines match beyond this page (after it; before it for a tail page).")


class LogQuerySerializer(serializers.Serializer):
    """The query of a log range: forward from ``after``, or the tail before ``before``."""

    stream = serializers.RegexField(STREAM_NAME, required=False, default="master", max_length=16, error_messages={"invalid": "Use master or worker-<n>."})
    after = serializers.IntegerField(min_value=0, max_value=MAX_DB_INT, required=False, help_text="Only lines with a greater seq.")

    def validate_stream(self, value: str) -> str:
        if not is_stream_name(value):
            raise serializers.ValidationError("Use master or worker-<n>.")
        return value

    before = serializers.IntegerField(
        min_value=0, max_value=MAX_DB_INT, required=False, help_text="Only lines with a smaller seq; without `after`, the last page before it."
    )
    limit = serializers.IntegerField(min_value=1, max_value=5000, required=False, default=1000)
    q = serializers.CharField(max_length=1000, required=False, help_text="Only lines containing this text (any case).")


class JobListQuerySerializer(serializers.Serializer):
    status = serializers.ListField(child=serializers.CharField(max_length=64), required=False)
    job_type = serializers.ChoiceField(choices=TrainingJob.JobType.values, required=False)
    search = serializers.CharField(max_length=200, required=False)
    ordering = serializers.ChoiceField(choices=ORDERINGS, required=False, default="-created_at")

    def validate_status(self, value: list[str]) -> list[str]:
        unknown = [text for text in value if text not in JobStatus.values]
        if unknown:
            raise serializers.ValidationError(f"Not a status: {', '.join(repr(t) for t in unknown)}. Use the exact texts: {', '.join(JobStatus.values)}.")
        return value


class GPUSerializer(serializers.ModelSerializer):
    allocated = serializers.SerializerMethodField(help_text="Held by a job's placement.")

    class Meta:
        model = GPU
        fields = ["index", "model", "memory_mb", "healthy", "health_reason", "allocated"]
        read_only_fields = fields

    def get_allocated(self, gpu: GPU) -> bool:
        return gpu.allocated_to_id is not None


class NodeSerializer(serializers.ModelSerializer):
    gpus = GPUSerializer(many=True, read_only=True)

    class Meta:
        model = Node
        fields = [
            "id",
            "name",
            "gpu_model",
            "state",
            "healthy",
            "health_reason",
            "cordoned",
            "simulated",
            "last_heartbeat",
            "cpu_count",
            "memory_mb",
            "limits_enforced",
            "limits_note",
            "gpus",
        ]
        read_only_fields = fields


class ErrorSerializer(serializers.Serializer):
    detail = serializers.CharField()


class TokenRequestSerializer(serializers.Serializer):
    username = serializers.CharField()
    password = serializers.CharField(style={"input_type": "password"})


class TokenSerializer(serializers.Serializer):
    token = serializers.CharField(help_text="Shown once: only its digest is stored.")
    expiry = serializers.DateTimeField(help_text="When it stops working; revoke it sooner on the account's Tokens page.")
