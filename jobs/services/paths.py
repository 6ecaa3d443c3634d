"""Where a job's files live on the nodes, and which host paths it may see.

A job writes to its work directory and its output directory: the default output directory is
``<JOB_WORK_ROOT>/<id>/output``; one the user chooses lies under the project's data directory
(``<PROJECT_DATA_ROOT>/<project>/``) or a writable project volume. ``..`` and symlinks that lead
out are refused when the job is created and again when a run is launched.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from jobs.models import Project, TrainingJob

MAX_PATH_CHARS = 500  # TrainingJob.output_dir's column


class PathRefused(ValueError):
    """The path is not one this job may use; the message says why."""


@dataclass(frozen=True)
class Volume:
    path: str
    read_only: bool


def job_dir(job_id: int) -> Path:
    return Path(settings.JOB_WORK_ROOT) / str(job_id)


def default_output_dir(job_id: int) -> Path:
    return job_dir(job_id) / "output"


def project_root(project: Project) -> Path:
    return Path(settings.PROJECT_DATA_ROOT) / project.name


def parse_volumes(text: str) -> list[Volume]:
    """``/data:ro,/srv/code:ro,/scratch:rw`` → volumes (read-only unless ``:rw``)."""
    volumes = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        path, _, mode = item.rpartition(":") if item.endswith((":ro", ":rw")) else (item, "", "ro")
        if not path.startswith("/"):
            raise PathRefused(f"Volume {item!r}: use an absolute host path.")
        volumes.append(Volume(os.path.normpath(path), mode != "rw"))
    return volumes


def volumes_of(project: Project | None) -> list[Volume]:
    """The host directories a project's jobs see: JOB_VOLUMES, then the project's own."""
    volumes = parse_volumes(settings.JOB_VOLUMES)
    if project is not None:
        volumes += [Volume(os.path.normpath(v.path), v.read_only) for v in project.volumes.all()]
    return volumes


def within(path: str | Path, root: str | Path) -> bool:
    """``path`` is ``root`` or below it, by name (nothing is resolved: below the root, the
    directories are a job's, and nothing a job controls is followed)."""
    path, root = os.path.normpath(path), os.path.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def link_below(path: Path, root: Path) -> Path | None:
    """The first component between ``root`` and ``path`` that is a symlink now, or None (each is
    looked at with ``lstat``, never followed; the agent's launch checks again, through
    descriptors, and that check is the one that counts)."""
    current = Path(root)
    for part in path.relative_to(root).parts:
        current = current / part
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            return None
        except OSError:
            return current  # changing under us (a job swapping it): as bad as a link
        if stat.S_ISLNK(info.st_mode):
            return current
    return None


def check_output_dir(value: str, project: Project) -> str:
    """The output directory a user asked for, normalised; raises PathRefused if not allowed.

    Empty means the default. A relative path lies under the project's data directory.
    """
    value = (value or "").strip()
    if not value:
        return ""
    if "\x00" in value:
        raise PathRefused("The path contains a NUL character.")
    if ".." in Path(value).parts:
        raise PathRefused("'..' is not allowed in an output directory.")
    root = project_root(project)
    path = Path(value) if value.startswith("/") else root / value
    path = Path(os.path.normpath(path))
    if len(str(path)) > MAX_PATH_CHARS:
        raise PathRefused(f"The output directory's full path, {len(str(path))} characters, is longer than {MAX_PATH_CHARS}.")
    if path == Path(os.path.normpath(root)):
        raise PathRefused(f"An output directory must lie below your project's data directory {root}, not be it: e.g. {root}/runs.")
    allowed = [root] + [Path(v.path) for v in volumes_of(project) if not v.read_only]
    base = next((candidate for candidate in allowed if within(path, candidate)), None)
    if base is None:
        where = ", ".join(str(p) for p in allowed)
        raise PathRefused(f"An output directory must lie in your project's data directory or a writable project volume: {where}.")
    link = link_below(path, Path(os.path.normpath(base)))
    if link is not None:
        raise PathRefused(f"{link} is a symbolic link: an output directory may not lie behind one.")
    return str(path)


@dataclass(frozen=True)
class OutputLocation:
    """Where a run's output directory is: ``parts`` below ``root`` (a directory of the agent's or
    an operator's). ``in_volume``: inside a writable project volume, which the run sees whole at
    its own path, so the agent makes nothing there."""

    root: Path
    parts: tuple[str, ...]
    in_volume: bool = False

    @property
    def path(self) -> Path:
        return self.root.joinpath(*self.parts)


def output_location(job: TrainingJob) -> OutputLocation:
    """The job's output directory as the agent makes and reads it (``agent.workdirs``); raises
    PathRefused if a chosen one is not below the project's data directory or a writable volume."""
    if not job.output_dir:
        return OutputLocation(Path(settings.JOB_WORK_ROOT), (str(job.pk), "output"))
    path = Path(check_output_dir(job.output_dir, job.project))
    root = Path(os.path.normpath(project_root(job.project)))
    if path == root or root in path.parents:
        parts = path.relative_to(root).parts
        if not parts:
            raise PathRefused(f"An output directory must lie below your project's data directory {root}, not be it.")
        return OutputLocation(root, parts)
    for volume in volumes_of(job.project):
        base = Path(volume.path)
        if not volume.read_only and (path == base or base in path.parents):
            return OutputLocation(base, path.relative_to(base).parts, in_volume=True)
    raise PathRefused(f"The output directory {path} is in none of your project's writable places.")


def output_dir_of(job: TrainingJob) -> Path:
    """Where a run of the job writes; raises PathRefused if a chosen directory now leads out
    (a symlink made since the job was created)."""
    if not job.output_dir:
        return default_output_dir(job.pk)
    check_output_dir(job.output_dir, job.project)
    return Path(job.output_dir)


def remove_job_files_of(job_id: int) -> None:
    """Delete a job's work directory, its runs' records and its default output directory (with
    their checkpoints). A chosen output directory in the project's data is the project's to keep."""
    shutil.rmtree(job_dir(job_id), ignore_errors=True)
