"""The job's fence (``agent.workdirs.write_fence``, docs/failover.md "A lost node's run"): each
launch moves it to its attempt before the resume step is chosen; the run reads it (ckptlib
commits only while it names the run's own attempt) and can never write it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from django.conf import settings

from agent import workdirs
from harness.job_factory import job_output
from harness.sandbox import needs_sandbox
from jobs.statuses import JobStatus


def fence_file(job_id: int) -> Path:
    return Path(settings.JOB_WORK_ROOT) / str(job_id) / workdirs.FENCE_DIR / workdirs.FENCE_FILE


def test_the_fence_only_moves_forward_and_is_the_agents_own(tmp_path):
    directory = workdirs.write_fence(tmp_path, 7, 2)
    assert (directory / "attempt").read_text() == "2\n"
    workdirs.write_fence(tmp_path, 7, 1)  # a late launch of an older attempt
    assert (directory / "attempt").read_text() == "2\n"
    workdirs.write_fence(tmp_path, 7, 3)
    assert (directory / "attempt").read_text() == "3\n"
    info = os.stat(directory)
    assert info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) == 0o755
    assert stat.S_IMODE(os.stat(directory / "attempt").st_mode) == 0o644
    assert sorted(p.name for p in directory.iterdir()) == ["attempt"]


def test_a_fence_left_by_an_earlier_job_of_the_same_id_is_replaced(tmp_path):
    """A JOB_WORK_ROOT kept across a database reset: job 7 is another job now."""
    directory = workdirs.write_fence(tmp_path, 7, 3, "install-a-100.0")
    workdirs.write_fence(tmp_path, 7, 1, "install-a-200.0")
    assert (directory / "attempt").read_text() == "1 install-a-200.0\n"
    workdirs.write_fence(tmp_path, 7, 1, "install-a-100.0")  # the old job's late launch: forward only
    assert (directory / "attempt").read_text() == "1 install-a-100.0\n"


def test_a_link_where_the_fence_directory_should_be_is_refused(tmp_path):
    (tmp_path / "8").mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "8" / workdirs.FENCE_DIR).symlink_to(elsewhere)
    with pytest.raises(workdirs.DirectoryRefused):
        workdirs.write_fence(tmp_path, 8, 1)
    assert list(elsewhere.iterdir()) == []


@pytest.mark.django_db
@pytest.mark.slow
def test_a_run_reads_its_own_attempt_in_the_fence(make_job, drive):
    job = drive(make_job(command='cat "$JOB_FENCE"; echo "attempt $JOB_ATTEMPT"'), JobStatus.COMPLETED, timeout=60)
    fence, attempt = job_output(job)[-2:]
    assert fence.split()[0] == "1" and attempt == "attempt 1"
    assert fence_file(job.pk).read_text() == fence + "\n"


WRITE_THE_FENCE = """
import os
fence = os.environ["JOB_FENCE"]
print("reads", open(fence).read().strip(), flush=True)
for attempt in (lambda: open(fence, "w").write("1"), lambda: os.replace(os.devnull, fence), lambda: open(fence + ".x", "w")):
    try:
        attempt()
        print("wrote", flush=True)
    except OSError as exc:
        print("refused", exc.strerror, flush=True)
"""


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
@needs_sandbox
def test_in_its_container_a_run_reads_the_fence_and_cannot_write_it(make_job, drive):
    import shlex

    job = drive(make_job(command="python -c " + shlex.quote(WRITE_THE_FENCE)), JobStatus.COMPLETED, timeout=120)
    out = job_output(job)
    assert any(line.startswith("reads 1 ") for line in out) and "wrote" not in out, out
    assert sum(line.startswith("refused") for line in out) == 3, out
    assert fence_file(job.pk).read_text().split()[0] == "1"
