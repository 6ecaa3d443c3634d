"""Which step a re-placed run resumes from (``CKPT_LAST_STEP``): the newest committed ckptlib
checkpoint on disk in the job's own storage, among the directories its commit lines reported
and its output directory's ``concurrent_checkpoint``.

A commit line is the job's own output, so its ``path=`` is hostile: it counts only when it names
a place below the job's work directory or its output directory, by the names the run saw them
under (``/job/work``, ``/job/output`` in a container; their host paths on a host run), written
without ``..``, ``.`` or empty components. The directory is then opened from the agent's own
root down, one component at a time without following links (``agent.workdirs.read_beneath``),
and ckptlib's own reader says what is committed there (``ckptlib.read_latest``: the ``latest``
marker, each checkpoint's manifest, sizes and sampled checksums, nothing followed or blocked on).
A path anywhere else (another job's directory, ``/tmp`` of the container, a project volume) is
never opened: it only makes the job page warn that those checkpoints do not survive a re-placement.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from django.conf import settings

from agent import sandbox, workdirs
from ckptlib import CHECKPOINT_SUBDIR, read_latest
from jobs.models import TrainingJob
from jobs.services.paths import OutputLocation, PathRefused, output_location
from logs.models import Checkpoint

logger = logging.getLogger(__name__)

# The newest commit rows looked at, and the most distinct directories opened per launch: the
# agent's work is bounded whatever a job prints.
REPORTED_ROWS = 200
REPORTED_ROOTS = 16
COMMITTED_NAME = re.compile(r"^checkpoint-\d+$")


@dataclass(frozen=True)
class Place:
    """A directory of the job's as a run names it (``in_run``) and as the agent opens it:
    ``parts`` below ``root``, a directory of the agent's or an operator's."""

    in_run: str
    root: Path
    parts: tuple[str, ...]


@dataclass(frozen=True)
class ResumePoint:
    step: int
    directory: str  # the checkpoint directory as the run names it, e.g. /job/work/results/concurrent_checkpoint


def places(job: TrainingJob, location: OutputLocation) -> list[Place]:
    """The job's work and output directories under every name a run of it may have used (in a
    container and on the host: an operator may have switched containers on or off between attempts)."""
    work = Place(sandbox.WORK_DIR, Path(settings.JOB_WORK_ROOT), (str(job.pk), "work"))
    work_on_host = Place(str(Path(settings.JOB_WORK_ROOT) / str(job.pk) / "work"), work.root, work.parts)
    output = Place(str(location.path), location.root, tuple(location.parts))
    found = [work, work_on_host, output]
    if not location.in_volume:  # a volume's output directory is seen at its own path only
        found.append(Place(sandbox.OUTPUT_DIR, location.root, tuple(location.parts)))
    return found


def components(path: str) -> tuple[str, ...] | None:
    """An absolute path's names, or None where it has ``..``, ``.``, an empty name, a NUL."""
    if not path.startswith("/") or "\x00" in path or len(path) > 1000:
        return None
    names = tuple(path.split("/")[1:])
    if any(name in ("", ".", "..") for name in names):
        return None
    return names


def place_of(path: str, known: list[Place]) -> tuple[Place, tuple[str, ...]] | None:
    """The place ``path`` lies in (by name, nothing resolved) and its names below it."""
    names = components(path)
    if names is None:
        return None
    for place in known:
        base = components(place.in_run)
        if base is not None and names[: len(base)] == base:
            return place, names[len(base) :]
    return None


def checkpoint_dir_of(commit_path: str, known: list[Place]) -> tuple[Place, tuple[str, ...]] | None:
    """The checkpoint directory (the parent of ``checkpoint-<N>``) a commit line's path names, as
    (its place, its names below the place); None when it lies outside the job's storage."""
    found = place_of(commit_path, known)
    if found is None:
        return None
    place, below = found
    if not below or not COMMITTED_NAME.match(below[-1]):
        return None
    return place, below[:-1]


def survives(commit_path: str, known: list[Place]) -> bool:
    """Whether a committed checkpoint lies where the next attempt (on any node) finds it."""
    return checkpoint_dir_of(commit_path, known) is not None


def committed_step(place: Place, below: tuple[str, ...]) -> int | None:
    """ckptlib's newest committed step in ``place/below…``, opened without following links."""
    names = (*place.parts, *below)
    opened = workdirs.read_beneath(place.root, names[:-1])
    if opened is None:
        return None
    try:
        # ckptlib opens the checkpoint directory itself without following it (nor anything inside).
        return read_latest(Path(opened) / names[-1])
    finally:
        workdirs.close_beneath(opened)


def reported_dirs(job: TrainingJob, known: list[Place]) -> list[tuple[Place, tuple[str, ...]]]:
    """The distinct checkpoint directories of the job's storage its commit lines named, newest first."""
    seen: set[tuple[Path, tuple[str, ...]]] = set()
    found: list[tuple[Place, tuple[str, ...]]] = []
    rows = Checkpoint.objects.filter(job=job).order_by("-committed_at", "-id").values_list("path", flat=True)[:REPORTED_ROWS]
    for path in rows:
        located = checkpoint_dir_of(path, known)
        if located is None:
            continue
        place, below = located
        key = (place.root, (*place.parts, *below))
        if key not in seen:
            seen.add(key)
            found.append(located)
        if len(found) >= REPORTED_ROOTS:
            break
    return found


def resume_point(job: TrainingJob, location: OutputLocation, *, contained: bool = True) -> ResumePoint | None:
    """The newest committed checkpoint on disk among the directories the job's commit lines
    reported (newest first) and its output directory's ``concurrent_checkpoint`` (named as a run
    in a container sees it when ``contained``); a tie goes to the directory reported last. None:
    start from the beginning."""
    known = places(job, location)
    named = sandbox.OUTPUT_DIR if contained and not location.in_volume else str(location.path)
    output = next(p for p in known if p.in_run == named)
    candidates = reported_dirs(job, known)
    if all((p.root, (*p.parts, *b)) != (output.root, (*output.parts, CHECKPOINT_SUBDIR)) for p, b in candidates):
        candidates.append((output, (CHECKPOINT_SUBDIR,)))
    best: ResumePoint | None = None
    for place, below in candidates:
        step = committed_step(place, below)
        if step is not None and (best is None or step > best.step):
            best = ResumePoint(step, str(PurePosixPath(place.in_run, *below)))
    if best is not None:
        logger.info("job %s resumes from checkpoint step %s in %s", job.pk, best.step, best.directory)
    return best


def storage_names(job: TrainingJob) -> list[str]:
    """The names a run gives the job's surviving directories (for the page's live warning)."""
    try:
        location = output_location(job)
    except PathRefused:
        return [sandbox.WORK_DIR, str(Path(settings.JOB_WORK_ROOT) / str(job.pk) / "work")]
    return [place.in_run for place in places(job, location)]


def commit_outside_storage(job: TrainingJob) -> str | None:
    """The path of the newest checkpoint the job's latest attempt committed when it lies outside
    the job's work and output directories (lost on a re-placement, so never resumed from); else None."""
    row = Checkpoint.objects.filter(job=job).order_by("-attempt", "-committed_at", "-id").values_list("path", flat=True).first()
    if row is None:
        return None
    try:
        known = places(job, output_location(job))
    except PathRefused:
        return None
    return None if not row or survives(row, known) else row


def resumable_step(job: TrainingJob) -> int | None:
    """The step of the newest checkpoint the job reported where a new attempt can find it (what
    the Resume action offers), or None; the node checks it on disk when the attempt starts."""
    try:
        known = places(job, output_location(job))
    except PathRefused:
        return None
    rows = Checkpoint.objects.filter(job=job).order_by("-committed_at", "-id").values_list("step", "path")[:REPORTED_ROWS]
    # A row without a path (none comes from a commit line) cannot be judged: the node's check decides.
    return next((step for step, path in rows if not path or survives(path, known)), None)


def warm_start_step(source: TrainingJob, step: int | None = None) -> int:
    """The step of ``source``'s committed checkpoint a warm start uses: ``step`` (None: the newest)
    among those it reported where a run of another job can be given it (its work or output
    directory); raises ValueError with why not. The node checks it on disk when the run starts."""
    try:
        known = places(source, output_location(source))
    except PathRefused as exc:
        raise ValueError(f"Job {source.pk}'s output directory cannot be read: {exc}") from None
    rows = Checkpoint.objects.filter(job=source).order_by("-committed_at", "-id").values_list("step", "path")[:REPORTED_ROWS]
    usable = [found for found, path in rows if path and survives(path, known)]
    if step is None:
        if not usable:
            raise ValueError(f"Job {source.pk} ({source.name}) has no committed checkpoint in its work or output directory to start from.")
        return max(usable)
    if step not in usable:
        listed = ", ".join(str(s) for s in sorted(set(usable))[-8:]) or "none"
        raise ValueError(f"Job {source.pk} ({source.name}) has no committed checkpoint at step {step} to start from (its steps: {listed}).")
    return step
