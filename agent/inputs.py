"""What a run starts with besides its image: the job's code bundle and a warm start's checkpoint.

Both are staged by the agent in the job's ``inputs`` directory (``<JOB_WORK_ROOT>/<job>/inputs``:
the agent's own, 0755, below directories only the agent writes), mounted read-only at
``/job/inputs``, and copied into place by the run itself, as the run's own user, before its
command (``Staged.setup``): the code into the work directory (``cp -R``: a file the job changed
is its bundle's again on every attempt, what it added stays), the checkpoint to where the source
job had it, below the new job's work or output directory (``./results/concurrent_checkpoint/
checkpoint-<N>`` for the guide's script), with ``CKPT_LAST_STEP`` naming its step. Nothing of a
job is ever written by the agent into a directory a job owns.

The source checkpoint is read through descriptors from the agent's own roots down, no link
followed (``agent.workdirs.read_beneath``), its files and directories only, and checked after
the copy as ckptlib checks one it resumes from (its manifest's sizes and sampled checksums).
"""

from __future__ import annotations

import io
import logging
import os
import shlex
import shutil
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from django.conf import settings

from agent import outputs, resume, sandbox, workdirs
from ckptlib._layout import CHECKPOINT_PREFIX, checkpoint_problem
from jobs.models import CodeBundle, TrainingJob
from jobs.services.paths import OutputLocation, PathRefused, output_location
from logs.models import Checkpoint

logger = logging.getLogger(__name__)

INPUTS = "inputs"
IN_RUN = "/job/inputs"
CODE = "code"
WARM = "warm"
MAX_ENTRIES = 100_000  # in a checkpoint copied for a warm start


class InputRefused(OSError):
    """The run cannot get what it starts with; the message says what and why."""


@dataclass
class Staged:
    """The job's inputs directory on the host (None: nothing staged), the shell lines that put
    them in place in the run, and the step a warm start resumes from."""

    directory: Path | None = None
    setup: list[str] = field(default_factory=list)
    resume_step: int | None = None


def inputs_dir(job: TrainingJob) -> tuple[Path, list[str]]:
    return Path(settings.JOB_WORK_ROOT), [str(job.pk), INPUTS]


def inputs_path(job: TrainingJob) -> Path:
    root, parts = inputs_dir(job)
    return root.joinpath(*parts)


def fresh_child(parent: Path, name: str) -> Path:
    """``parent/name`` made anew (the agent's own directory: nothing of a job's is ever in it)."""
    target = parent / name
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.exists():
        shutil.rmtree(target)
    target.mkdir(mode=0o755)
    return target


def stage_code(job: TrainingJob, bundle_id: int, inputs: Path, in_run: str, work_in_run: str) -> list[str]:
    """Unpack the job's bundle into ``inputs/code`` (once per bundle) and say how the run copies it."""
    bundle = CodeBundle.objects.only("sha256", "archive", "files", "unpacked_size").get(pk=bundle_id)
    marker = inputs / f".{CODE}-{bundle.sha256}"
    if not marker.exists() or not (inputs / CODE).is_dir():
        for old in inputs.glob(f".{CODE}-*"):
            old.unlink()
        target = fresh_child(inputs, CODE)
        with tarfile.open(fileobj=io.BytesIO(bytes(bundle.archive)), mode="r:gz") as archive:
            # The bundle holds files and directories only (jobs.services.bundles); the data filter
            # would refuse anything else, and the target is the agent's own.
            archive.extractall(target, filter="data")
        marker.touch()
    source, work = shlex.quote(f"{in_run}/{CODE}/."), shlex.quote(work_in_run)
    return [
        f"echo {shlex.quote(f'[satrain] code: bundle {bundle_id} ({bundle.files} files) copied to {work_in_run}')}",
        f"cp -R {source} {work} || {{ echo '[satrain] the code bundle could not be copied to the work directory' >&2; exit 1; }}",
    ]


def whole_tree(fd: int, prefix: str, max_entries: int, what: str) -> Iterator[tuple[outputs.Entry, int | None]]:
    """Every entry below the directory open at ``fd``, walked as a download is
    (``agent.outputs.walk``: opened without following links), strictly: directories (no handle)
    and regular files (a descriptor, closed once the caller's turn is over), every one of them; a
    link, anything else, an unreadable entry or more than ``max_entries`` refuses, naming ``what``."""
    for count, (entry, handle) in enumerate(outputs.walk(fd, prefix, max_entries + 1, strict=True), start=1):
        try:
            if count > max_entries:
                raise InputRefused(f"the {what} holds more than {max_entries:,} entries")
            if entry.kind != "directory" and handle is None:
                raise InputRefused(f"the {what} holds {entry.path!r}, which is not a file or a directory")
            yield entry, handle
        finally:
            if handle is not None:
                os.close(handle)


def copy_tree(source_fd: int, target: Path) -> None:
    """Copy the directory open at ``source_fd`` into the new directory ``target`` (``whole_tree``)."""
    for entry, handle in whole_tree(source_fd, "", MAX_ENTRIES, "checkpoint"):
        if handle is None:
            (target / entry.path).mkdir(mode=0o755)
            continue
        with os.fdopen(os.dup(handle), "rb") as reader, open(target / entry.path, "xb") as writer:
            shutil.copyfileobj(reader, writer, 1 << 20)
        os.chmod(target / entry.path, 0o644)


def staged_problem(directory: Path, name: str) -> str | None:
    """What ckptlib would refuse in the checkpoint ``directory/name`` the agent staged (its
    manifest's sizes and sampled checksums); None when it is whole."""
    fd = os.open(directory, workdirs.DIR_FLAGS)
    try:
        return checkpoint_problem(fd, name)
    finally:
        os.close(fd)


def warm_source(job: TrainingJob) -> tuple[TrainingJob, Checkpoint]:
    source = job.warm_start_job
    if source is None or job.warm_start_step is None:
        raise InputRefused(f"the job it warm-starts from (checkpoint step {job.warm_start_step}) was deleted")
    row = Checkpoint.objects.filter(job=source, step=job.warm_start_step).order_by("-attempt", "-committed_at").first()
    if row is None:
        raise InputRefused(f"job {source.pk} ({source.name}) has no committed checkpoint at step {job.warm_start_step}")
    return source, row


def stage_warm(job: TrainingJob, location: OutputLocation, inputs: Path, in_run: str, *, contained: bool) -> tuple[list[str], int]:
    """Copy the warm start's checkpoint into ``inputs/warm`` (checked as ckptlib checks one) and
    say where the run puts it; returns the lines and the step."""
    source, row = warm_source(job)
    try:
        found = resume.checkpoint_dir_of(row.path, resume.places(source, output_location(source)))
    except PathRefused as exc:
        raise InputRefused(f"job {source.pk}'s output directory cannot be read: {exc}") from None
    if found is None:
        raise InputRefused(f"job {source.pk}'s checkpoint at step {row.step} ({row.path}) lies outside its work and output directories")
    place, below = found
    name = f"{CHECKPOINT_PREFIX}{row.step}"
    opened = workdirs.read_beneath(place.root, (*place.parts, *below, name))
    if opened is None:
        raise InputRefused(f"job {source.pk}'s checkpoint at step {row.step} is no longer on disk ({row.path})")
    warm = fresh_child(inputs, WARM)
    try:
        (warm / name).mkdir(mode=0o755)
        copy_tree(int(opened.rsplit("/", 1)[1]), warm / name)
    except OSError as exc:
        raise InputRefused(f"job {source.pk}'s checkpoint at step {row.step} could not be copied: {exc}") from None
    finally:
        workdirs.close_beneath(opened)
    problem = staged_problem(warm, name)
    if problem:
        raise InputRefused(f"job {source.pk}'s checkpoint at step {row.step} is damaged: {problem}")
    # Where the source job had it, below the new job's own work or output directory.
    work_place = place.parts == (str(source.pk), "work") and place.root == Path(settings.JOB_WORK_ROOT)
    if work_place:
        base = sandbox.WORK_DIR if contained else str(Path(settings.JOB_WORK_ROOT) / str(job.pk) / "work")
    else:
        base = sandbox.OUTPUT_DIR if contained and not location.in_volume else str(location.path)
    root = str(PurePosixPath(base, *below))
    copied = str(PurePosixPath(root, name))
    said = f"[satrain] warm start: checkpoint step {row.step} of job {source.pk} ({source.name}) copied to {copied}"
    lines = [
        f"if [ ! -e {shlex.quote(copied)} ]; then",
        f"  mkdir -p {shlex.quote(root)} && cp -R {shlex.quote(f'{in_run}/{WARM}/{name}')} {shlex.quote(root)}/ "
        f"&& printf '%s\\n' {row.step} > {shlex.quote(root + '/latest')} "
        "|| { echo '[satrain] the warm-start checkpoint could not be copied' >&2; exit 1; }",
        "fi",
        f"echo {shlex.quote(said)}",
    ]
    return lines, row.step


def stage(job: TrainingJob, location: OutputLocation, work_in_run: str, *, contained: bool, warm: bool) -> Staged:
    """Stage the job's code bundle and, with ``warm``, its warm start's checkpoint; raises
    InputRefused with the reason."""
    if job.code_id is None and not (warm and job.warm_start_step is not None):
        return Staged()
    inputs = workdirs.make_readable(*inputs_dir(job))
    in_run = IN_RUN if contained else str(inputs)
    staged = Staged(directory=inputs)
    try:
        if job.code_id is not None:
            staged.setup += stage_code(job, job.code_id, inputs, in_run, work_in_run)
        if warm and job.warm_start_step is not None:
            lines, staged.resume_step = stage_warm(job, location, inputs, in_run, contained=contained)
            staged.setup += lines
    except (OSError, tarfile.TarError) as exc:
        raise InputRefused(str(exc)) from None
    return staged
