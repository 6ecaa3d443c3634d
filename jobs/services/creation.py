"""Creating and cloning Training Jobs, and the personal project every user gets."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any, cast

from django.conf import settings
from django.db import IntegrityError, models, transaction

from jobs.job_fields import Assignment, leading_assignments, normalize_text_fields, without_assignments
from jobs.models import CodeBundle, Project, TrainingJob
from jobs.secret_env import SecretEnv, is_secret_name
from jobs.services.bundles import bundle_problem
from jobs.services.capacity import network_refusal, shape_refusal
from jobs.services.lifecycle import record_creation
from jobs.services.limits import LimitRefused, check_limits
from jobs.services.messages import request_placement
from jobs.services.paths import PathRefused, check_output_dir
from jobs.statuses import JobStatus

logger = logging.getLogger(__name__)


class JobRefused(Exception):
    """A job the queue's limits do not accept now; the message says which and why."""


class JobSettingsRefused(JobRefused):
    """Settings a job may not have: ``problems`` holds every reason under the field it is about
    (the form and the API show each on its field)."""

    def __init__(self, problems: dict[str, list[str]]) -> None:
        super().__init__(" ".join(reason for reasons in problems.values() for reason in reasons))
        self.problems = problems


def check_waiting_limit(owner) -> None:
    """Refuse a new job while ``owner`` already has QUEUE_MAX_WAITING_PER_USER jobs waiting."""
    limit = settings.QUEUE_MAX_WAITING_PER_USER
    waiting = TrainingJob.objects.filter(owner=owner, status__in=[JobStatus.PENDING, JobStatus.IMAGE_PULL_BACKOFF]).count()
    if waiting >= limit:
        raise JobRefused(f"You already have {waiting} jobs waiting (the limit is {limit} per user); wait for some to start or stop some before creating more.")


def personal_project_for(user) -> Project:
    """The user's own project, created on first use."""
    try:
        return user.personal_project
    except Project.DoesNotExist:
        pass
    base = re.sub(r"[^a-z0-9-]+", "-", user.get_username().lower()).strip("-")[:50] or "user"
    name = f"{base}-personal"
    with transaction.atomic():
        if Project.objects.filter(name=name).exists():
            name = f"{base}-{user.pk}-personal"
        project = Project.objects.create(name=name, personal_for=user, description=f"{user.get_username()}'s jobs")
        project.members.add(user)
    return project


def create_job(*, owner, actor: str | None = None, **fields: Any) -> TrainingJob:
    """Create a Pending job from fields the form or the API parsed (a clone's: its source's);
    raises JobSettingsRefused for settings ``check_settings`` refuses, JobRefused past the
    per-user limit of waiting jobs."""
    fields = normalize_text_fields(fields)
    if fields.get("project") is None:
        fields["project"] = personal_project_for(owner)
    fields = with_secrets_apart(check_settings(fields, owner=owner))
    check_waiting_limit(owner)
    with transaction.atomic():
        job = TrainingJob.objects.create(owner=owner, **fields)
        record_creation(job, actor=actor or owner.get_username())
        request_placement()
    return job


def setting(fields: Mapping[str, Any], name: str) -> Any:
    """The value of a job setting in ``fields``; the model's default where it is not given."""
    value = fields.get(name)
    return cast(models.Field, TrainingJob._meta.get_field(name)).get_default() if value is None else value


def check_settings(fields: Mapping[str, Any], *, owner) -> dict[str, Any]:
    """``fields`` as a job may have them (its output directory and limits normalised), or
    JobSettingsRefused with every problem. Every way to a job that runs calls it (create, from the
    form and the API; clone; resume): its shape must fit a registered node set, its project must
    allow its nodes' network, its output directory must lie where the project may write, its
    limits within the largest node, and its command may not set a secret the environment sets too.
    A setting not in ``fields`` is checked at the model's default; the project defaults to the
    owner's own."""
    checked = dict(fields)
    problems: dict[str, list[str]] = {}
    project = fields.get("project") or personal_project_for(owner)
    for name in ("cpu_limit", "memory_limit_mb"):
        if fields.get(name) is not None:
            try:
                checked[name] = check_limits(**{name: fields[name]})[name]
            except LimitRefused as exc:
                problems.setdefault(exc.field, []).append(str(exc))
    refusal = shape_refusal(setting(fields, "gpus_per_node"), setting(fields, "node_count"))
    if refusal:
        problems.setdefault("gpus_per_node", []).append(refusal)
    refusal = network_refusal(project, setting(fields, "node_count"))
    if refusal:
        problems.setdefault("node_count", []).append(refusal)
    if fields.get("output_dir"):
        try:
            checked["output_dir"] = check_output_dir(fields["output_dir"], project)
        except PathRefused as exc:
            problems.setdefault("output_dir", []).append(str(exc))
    refusal = bundle_problem(fields.get("code"), project)
    if refusal:
        problems.setdefault("code", []).append(refusal)
    if fields.get("warm_start_job") is not None and fields.get("warm_start_step") is None:
        problems.setdefault("warm_start_step", []).append("Name the step of the checkpoint to start from.")
    if fields.get("command"):
        environment = set(fields.get("env") or {}) | set(secret_env_of(fields).names)
        _, secrets, refusals = command_secrets(fields["command"])
        refusals += [f"{name} is set both in the command and in the environment variables: keep one of them." for name in secrets if name in environment]
        if refusals:
            problems.setdefault("command", []).extend(refusals)
    if problems:
        raise JobSettingsRefused(problems)
    return checked


# After these a statement of assignments alone would be left empty by taking its secrets out
# (``HF_TOKEN=… && python …``); before a redirection (``<``, ``>``) the rest still runs.
ENDS_A_STATEMENT = frozenset(";&|()")


def command_secrets(command: str) -> tuple[list[Assignment], dict[str, str], list[str]]:
    """The command's leading assignments of secret names (``HF_TOKEN=hf_… python …``) that move
    to the job's secret variables, their values, and why some cannot move. A value the shell
    would expand (``HF_TOKEN=$(cat …)``) stays in the command: it is no secret written out."""
    taken = [a for a in leading_assignments(command) if a.literal and is_secret_name(a.name)]
    values: dict[str, str] = {}
    refusals: list[str] = []
    for assignment in taken:
        if assignment.then in ENDS_A_STATEMENT:
            refusals.append(
                f"{assignment.name} is set in the command before '{assignment.then}', where it cannot be kept secret: "
                f"write it in front of the program ({assignment.name}=… python …) or in the environment variables."
            )
        elif values.setdefault(assignment.name, assignment.value) != assignment.value:
            refusals.append(f"{assignment.name} is set twice in the command, to different values: keep one of them.")
    return taken, values, list(dict.fromkeys(refusals))


def secret_env_of(fields: Mapping[str, Any]) -> SecretEnv:
    return TrainingJob._meta.get_field("secret_env").to_python(fields.get("secret_env"))


def with_secrets_apart(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with every variable of ``env`` whose name is secret by default (``*_TOKEN``,
    ``*_KEY``, ``*_PASSWORD``, ``*_SECRET``) moved to ``secret_env``, a name in both being the
    secret one; and the command's leading assignments of such names too (``check_settings``
    has refused a name also in the environment), so the stored command holds no value of them."""
    env = fields.get("env") or {}
    moved = {name: value for name, value in env.items() if is_secret_name(name)}
    taken, from_command, _ = command_secrets(fields.get("command") or "")
    if not moved and not taken and isinstance(fields.get("secret_env"), SecretEnv):
        return fields
    values = {**from_command, **moved, **secret_env_of(fields).reveal()}
    apart = {**fields, "env": {k: v for k, v in env.items() if k not in values}, "secret_env": SecretEnv.of(values)}
    if taken:
        apart["command"] = without_assignments(fields["command"], taken).strip()
    return apart


# What a user sets on a job (the form, the API and a clone carry exactly these).
JOB_SETTINGS = (
    "project",
    "job_type",
    "image",
    "command",
    "env",
    # Kept encrypted by a clone: copied without ever being shown.
    "secret_env",
    "gpus_per_node",
    "node_count",
    "failover_enabled",
    "checkpointless",
    "output_dir",
    "max_run_minutes",
    "cpu_limit",
    "memory_limit_mb",
    "description",
    "code",
    "warm_start_job",
    "warm_start_step",
)


def clone_name(source: TrainingJob, owner) -> str:
    """``<name>-copy``, then ``<name>-copy-2`` … : the first name the owner does not use yet."""
    # Room for "-copy-NNNN" within the 63 characters of a DNS label.
    stem = source.name[:53].rstrip("-")
    taken = set(TrainingJob.objects.filter(owner=owner, name__startswith=f"{stem}-copy").values_list("name", flat=True))
    candidate = f"{stem}-copy"
    n = 2
    while candidate in taken:
        candidate = f"{stem}-copy-{n}"
        n += 1
    return candidate


def clone_job(source: TrainingJob, *, owner, name: str | None = None) -> TrainingJob:
    """A new Pending job with the source's settings, owned by ``owner``; the source's secret
    variables only when ``owner`` owns the source too."""
    fields = {f: getattr(source, f) for f in JOB_SETTINGS if f != "code"}
    # The bundle without its archive (the nodes read that when they unpack it).
    fields["code"] = CodeBundle.objects.defer("archive").filter(pk=source.code_id).first() if source.code_id else None
    if owner.pk != source.owner_id:
        # Another user's clone would hand them the values in a run they control.
        fields["secret_env"] = {}
    if not source.project.members.filter(pk=owner.pk).exists() and not owner.is_staff:
        fields["project"] = personal_project_for(owner)
    if source.warm_start_job_id and not TrainingJob.objects.visible_to(owner).filter(pk=source.warm_start_job_id).exists():
        # A warm start from a job the cloner may not see would hand them its checkpoint.
        fields["warm_start_job"], fields["warm_start_step"] = None, None
    for _ in range(3):
        try:
            return create_job(owner=owner, name=name or clone_name(source, owner), **fields)
        except IntegrityError:
            if name:
                raise
    raise IntegrityError("could not find a free name for the clone")
