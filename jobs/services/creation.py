"""Creating and cloning Training Jobs, and the personal project every user gets."""
from __future__ import annotations

import logging
import re
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from jobs.job_fields import normalize_text_fields
from jobs.models import Project, TrainingJob
from jobs.secret_env import SecretEnv, is_secret_name
from jobs.services.lifecycle import record_creation
from jobs.services.messages import request_placement
from jobs.statuses import JobStatus

logger = logging.getLogger(__name__)


class JobRefused(Exception):
    """A job the queue's limits do not accept now; the message says which and why."""


def check_waiting_limit(owner) -> None:
    """Refuse a new job while ``owner`` already has QUEUE_MAX_WAITING_PER_USER jobs waiting."""
    limit = settings.QUEUE_MAX_WAITING_PER_USER
    waiting = TrainingJob.objects.filter(owner=owner, status__in=[JobStatus.PENDING, JobStatus.IMAGE_PULL_BACKOFF]).count()
    if waiting >= limit:
        raise JobRefused(
            f"You already have {waiting} jobs waiting (the limit is {limit} per user); "
            "wait for some to start or stop some before creating more."
        )


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
    """Create a Pending job from validated fields (the form and the API validate them); raises
    JobRefused past the per-user limit of waiting jobs."""
    fields = with_secrets_apart(normalize_text_fields(fields))
    if fields.get("project") is None:
        fields["project"] = personal_project_for(owner)
    check_waiting_limit(owner)
    with transaction.atomic():
        job = TrainingJob.objects.create(owner=owner, **fields)
        record_creation(job, actor=actor or owner.get_username())
        request_placement()
    return job


def with_secrets_apart(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with every variable of ``env`` whose name is secret by default (``*_TOKEN``,
    ``*_KEY``, ``*_PASSWORD``, ``*_SECRET``) moved to ``secret_env``; a name in both is the secret one."""
    env = fields.get("env") or {}
    moved = {name: value for name, value in env.items() if is_secret_name(name)}
    secret = TrainingJob._meta.get_field("secret_env").to_python(fields.get("secret_env"))
    if not moved and isinstance(fields.get("secret_env"), SecretEnv):
        return fields
    values = {**moved, **secret.reveal()}
    return {**fields, "env": {k: v for k, v in env.items() if k not in values}, "secret_env": SecretEnv.of(values)}


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
    "output_dir",
    "max_run_minutes",
    "cpu_limit",
    "memory_limit_mb",
    "description",
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
    fields = {f: getattr(source, f) for f in JOB_SETTINGS}
    if owner.pk != source.owner_id:
        # Another user's clone would hand them the values in a run they control.
        fields["secret_env"] = {}
    if not source.project.members.filter(pk=owner.pk).exists() and not owner.is_staff:
        fields["project"] = personal_project_for(owner)
    for _ in range(3):
        try:
            return create_job(owner=owner, name=name or clone_name(source, owner), **fields)
        except IntegrityError:
            if name:
                raise
    raise IntegrityError("could not find a free name for the clone")
