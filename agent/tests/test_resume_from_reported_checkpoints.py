"""A re-placed run resumes from the newest committed checkpoint its commit lines reported in its
own storage (``./results`` in its work directory, as the guide's script saves), checked on disk
by ckptlib's reader; a forged commit line that names another job's directory, a symlink or
``..`` is never opened."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from agent.resume import places, resume_point, survives
from ckptlib._layout import MANIFEST_NAME
from jobs.services.paths import output_location
from logs.models import Checkpoint

pytestmark = pytest.mark.django_db


def work_dir(job) -> Path:
    return Path(settings.JOB_WORK_ROOT) / str(job.pk) / "work"


def output_dir(job) -> Path:
    return Path(settings.JOB_WORK_ROOT) / str(job.pk) / "output"


def committed(root: Path, *steps: int, damaged: bool = False) -> None:
    """Checkpoint directories as ckptlib commits them: a manifest listing each file's size."""
    for step in steps:
        directory = root / f"checkpoint-{step}"
        directory.mkdir(parents=True)
        (directory / "model.pt").write_bytes(b"x" * 10)
        (directory / MANIFEST_NAME).write_text(json.dumps({"files": {"model.pt": 9 if damaged else 10}}))
    (root / "latest").write_text(f"{max(steps)}\n")


def reported(job, step: int, path: str, attempt: int = 1) -> None:
    """The row a commit line ``… committed step=<step> … path=<path>`` leaves."""
    Checkpoint.objects.create(job=job, attempt=attempt, step=step, path=path, committed_at=timezone.now())


def point(job):
    return resume_point(job, output_location(job))


def test_a_run_that_saved_in_its_work_directory_resumes_from_there(make_job):
    job = make_job()
    committed(work_dir(job) / "results" / "concurrent_checkpoint", 20, 40, 60)
    for step in (20, 40, 60):
        reported(job, step, f"/job/work/results/concurrent_checkpoint/checkpoint-{step}")
    found = point(job)
    assert (found.step, found.directory) == (60, "/job/work/results/concurrent_checkpoint")


def test_a_run_on_the_host_names_its_work_directory_by_its_host_path(make_job):
    job = make_job()
    committed(work_dir(job) / "results" / "concurrent_checkpoint", 20)
    reported(job, 20, f"{work_dir(job)}/results/concurrent_checkpoint/checkpoint-20")
    assert point(job).step == 20


def test_without_reports_the_output_directory_is_still_read(make_job):
    job = make_job()
    committed(output_dir(job) / "concurrent_checkpoint", 5)
    found = point(job)
    assert (found.step, found.directory) == (5, "/job/output/concurrent_checkpoint")


def test_the_newest_step_on_disk_wins_and_a_damaged_checkpoint_is_skipped(make_job):
    job = make_job()
    committed(work_dir(job) / "results" / "concurrent_checkpoint", 20, 40)
    committed(work_dir(job) / "results" / "concurrent_checkpoint", 60, damaged=True)
    committed(output_dir(job) / "concurrent_checkpoint", 30)
    for step in (20, 40, 60):
        reported(job, step, f"/job/work/results/concurrent_checkpoint/checkpoint-{step}")
    # 60's model.pt does not have the size its manifest records: ckptlib's check refuses it.
    assert point(job).step == 40


def test_a_reported_checkpoint_that_is_not_on_disk_is_no_resume_point(make_job):
    job = make_job()
    reported(job, 80, "/job/work/results/concurrent_checkpoint/checkpoint-80")
    assert point(job) is None


def test_a_forged_commit_line_naming_another_jobs_directory_is_never_opened(make_job, outsider):
    victim = make_job(owner=outsider, name="victim")
    job = make_job(name="forger")
    committed(output_dir(victim) / "concurrent_checkpoint", 900)
    committed(work_dir(victim) / "results" / "concurrent_checkpoint", 901)
    forged = [
        f"{output_dir(victim)}/concurrent_checkpoint/checkpoint-900",  # the victim's host path
        f"/job/work/../../{victim.pk}/output/concurrent_checkpoint/checkpoint-900",  # climbing out
        f"/job/work/./../../{victim.pk}/work/results/concurrent_checkpoint/checkpoint-901",
        f"/job/output//../../{victim.pk}/output/concurrent_checkpoint/checkpoint-900",
        f"{settings.JOB_WORK_ROOT}/{victim.pk}/work/results/concurrent_checkpoint/checkpoint-901",
    ]
    for n, path in enumerate(forged):
        reported(job, 900 + n, path)
    assert point(job) is None
    known = places(job, output_location(job))
    assert not any(survives(path, known) for path in forged)
    # The victim's own answer is unaffected (it reported nothing: its output directory's).
    assert point(victim).step == 900
    reported(victim, 901, "/job/work/results/concurrent_checkpoint/checkpoint-901")
    assert point(victim).step == 901


def test_a_symlink_in_the_reported_directory_is_not_followed(make_job, outsider):
    victim = make_job(owner=outsider, name="victim")
    job = make_job(name="linker")
    committed(output_dir(victim) / "concurrent_checkpoint", 900)
    work_dir(job).mkdir(parents=True)
    # The job links ./results to the victim's output directory, then prints a commit line there.
    (work_dir(job) / "results").symlink_to(output_dir(victim))
    reported(job, 900, "/job/work/results/concurrent_checkpoint/checkpoint-900")
    # And links its own checkpoint directory (the last component) elsewhere too.
    (work_dir(job) / "other").mkdir()
    (work_dir(job) / "other" / "concurrent_checkpoint").symlink_to(output_dir(victim) / "concurrent_checkpoint")
    reported(job, 900, "/job/work/other/concurrent_checkpoint/checkpoint-900", attempt=2)
    assert point(job) is None


def test_checkpoints_outside_the_jobs_storage_do_not_survive(make_job):
    job = make_job()
    known = places(job, output_location(job))
    assert survives("/job/work/results/concurrent_checkpoint/checkpoint-20", known)
    assert survives("/job/output/concurrent_checkpoint/checkpoint-20", known)
    assert not survives("/tmp/results/concurrent_checkpoint/checkpoint-20", known)
    assert not survives("/job/workshop/concurrent_checkpoint/checkpoint-20", known)
    assert not survives("relative/concurrent_checkpoint/checkpoint-20", known)
    assert not survives("/job/work/results/concurrent_checkpoint/not-a-checkpoint", known)
