"""The job's directories as the detail page names them: the path its run sees, for everyone (in the
container ``/job/work`` and ``/job/output``; a writable project volume at its own path), and the
node's host path for staff only (a user has no use for the platform's layout of a node's disks,
and their run cannot reach it). Where jobs run without containers (``JOB_SANDBOX=off``) the run
sees the host's paths, and so does its page."""

from __future__ import annotations

import os
from dataclasses import dataclass

from django.conf import settings

from agent import sandbox
from agent.resume import storage_names
from jobs.models import TrainingJob
from jobs.services.paths import default_output_dir, project_root, within


@dataclass(frozen=True)
class RunDir:
    in_run: str  # the path the run sees
    on_host: str  # where it lies on the node (the same path for a volume, or without containers)


def contained() -> bool:
    """Whether runs start in containers (the agent's launch reads the same setting)."""
    return settings.JOB_SANDBOX != "off"


def output_dir(job: TrainingJob) -> RunDir:
    """The job's output directory, by name (as ``jobs.services.paths.output_location`` places it:
    the job's own and one in the project's data directory are mounted at ``/job/output``; one in
    a writable project volume is seen at its own path)."""
    root = project_root(job.project)
    chosen = os.path.normpath(root / job.output_dir) if job.output_dir else ""  # a relative one lies in root
    on_host = chosen or str(default_output_dir(job.pk))
    if not contained() or (chosen and not within(chosen, root)):
        return RunDir(on_host, on_host)
    return RunDir(sandbox.OUTPUT_DIR, on_host)


def visible_storage_names(job: TrainingJob, *, staff: bool) -> list[str]:
    """The names a run gives the job's surviving directories (``agent.resume.storage_names``, for
    the page's live checkpoint warning): all of them for staff; for users, those a run sees."""
    names = storage_names(job)
    if staff or not contained():
        return names
    seen = {sandbox.WORK_DIR, sandbox.OUTPUT_DIR, output_dir(job).in_run}
    return [name for name in names if name in seen]
