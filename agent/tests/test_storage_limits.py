"""Storage limits: what a run's files take is measured as the kubelet measures ephemeral storage
(allocated blocks, links not followed, hard links once, bounded), and a run over its limit, or the
largest user of a project over its total, ends Failed with a reason that says so."""

from __future__ import annotations

import os
import shlex
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent import storage
from agent.storage import Tree, measure
from harness.sandbox import needs_sandbox
from jobs.backends.facts import exited
from jobs.models import JobAttempt, JobEvent
from jobs.services import runs
from jobs.services.limits import StorageUse, format_storage, storage_verdicts
from jobs.services.placement import place_waiting_jobs
from jobs.statuses import JobStatus

MiB = 2**20
GiB = 2**30


def allocated(path: Path) -> int:
    return os.lstat(path).st_blocks * 512


def write(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(os.urandom(size))
        fh.flush()
        os.fsync(fh.fileno())
    return path


def dirs_below(top: Path) -> int:
    """The blocks of ``top`` and every directory below it (a walk counts them too)."""
    return allocated(top) + sum(allocated(Path(d) / name) for d, names, _ in os.walk(top) for name in names)


# --- the measurement -------------------------------------------------------------------------------
def test_it_counts_the_blocks_a_tree_holds(tmp_path):
    data = write(tmp_path / "work" / "a" / "b" / "data", 3 * MiB)
    walk = measure([Tree(tmp_path, ("work",))])
    assert not walk.cut
    assert walk.bytes == allocated(data) + dirs_below(tmp_path / "work")
    assert walk.bytes >= 3 * MiB


def test_a_hard_linked_file_counts_once_even_across_its_trees(tmp_path):
    data = write(tmp_path / "work" / "data", 2 * MiB)
    os.link(data, tmp_path / "work" / "again")
    (tmp_path / "output").mkdir()
    os.link(data, tmp_path / "output" / "elsewhere")
    walk = measure([Tree(tmp_path, ("work",)), Tree(tmp_path, ("output",))])
    assert walk.bytes == allocated(data) + allocated(tmp_path / "work") + allocated(tmp_path / "output")


def test_symbolic_links_are_never_followed(tmp_path):
    outside = write(tmp_path / "outside" / "big", 4 * MiB)
    work = tmp_path / "work"
    work.mkdir()
    (work / "to-file").symlink_to(outside)
    (work / "to-dir").symlink_to(outside.parent, target_is_directory=True)
    (work / "to-root").symlink_to("/")
    walk = measure([Tree(tmp_path, ("work",))])
    links = sum(allocated(work / name) for name in ("to-file", "to-dir", "to-root"))
    assert walk.bytes == allocated(work) + links < MiB


def test_a_tree_whose_directory_is_a_link_counts_nothing(tmp_path):
    write(tmp_path / "outside" / "big", 4 * MiB)
    (tmp_path / "output").symlink_to(tmp_path / "outside", target_is_directory=True)
    assert measure([Tree(tmp_path, ("output",))]).bytes == 0


def test_a_sparse_file_counts_the_blocks_it_holds_not_its_length(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    with open(work / "sparse", "wb") as fh:
        fh.truncate(8 * GiB)
        fh.seek(4 * GiB)
        fh.write(b"x" * 4096)
    assert os.path.getsize(work / "sparse") == 8 * GiB
    walk = measure([Tree(tmp_path, ("work",))])
    assert walk.bytes == allocated(work) + allocated(work / "sparse") < MiB


def test_a_tree_deeper_than_the_open_descriptors_is_counted_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(storage, "WALK_MAX_OPEN", 3)
    deep = tmp_path / "work" / Path(*[f"d{i}" for i in range(12)])
    data = write(deep / "data", MiB)
    write(tmp_path / "work" / "d0" / "d1" / "side" / "more", MiB)
    walk = measure([Tree(tmp_path, ("work",))])
    files = allocated(data) + allocated(tmp_path / "work" / "d0" / "d1" / "side" / "more")
    assert walk.bytes == files + dirs_below(tmp_path / "work")


def test_a_walk_stops_at_its_bound_and_says_it_is_a_lower_bound(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    for i in range(300):
        (work / f"f{i}").write_bytes(b"x")
    walk = measure([Tree(tmp_path, ("work",))], max_entries=100)
    assert walk.cut and walk.entries == 100
    assert measure([Tree(tmp_path, ("work",))]).entries == 301


# --- the decision ---------------------------------------------------------------------------------
def use(attempt_id: int, used: float, *, project_id: int = 1, complete: bool = True) -> StorageUse:
    return StorageUse(job_id=attempt_id, project_id=project_id, attempt_id=attempt_id, used=int(used), complete=complete)


def test_a_run_over_its_limit_must_end_with_the_figures_in_its_reason():
    verdicts = storage_verdicts([use(1, 10.4 * GiB), use(2, 9.9 * GiB)], job_limit=10 * GiB, project_limits={})
    assert verdicts == {
        1: "storage limit reached: used 10.4 GiB of its 10 GiB storage limit (work and output directories and the container's own files): stopped"
    }


def test_no_limit_ends_nothing_and_a_cut_walk_says_at_least():
    assert storage_verdicts([use(1, 500 * GiB)], job_limit=None, project_limits={}) == {}
    verdicts = storage_verdicts([use(1, 60 * MiB, complete=False)], job_limit=int(0.05 * GiB), project_limits={})
    assert "used at least 60 MiB of its 51.2 MiB storage limit" in verdicts[1]


def test_a_project_over_its_total_stops_its_largest_users_until_the_rest_fit():
    uses = [use(1, 3 * GiB), use(2, 5 * GiB), use(3, 4 * GiB), use(4, 50 * GiB, project_id=2)]
    verdicts = storage_verdicts(uses, job_limit=None, project_limits={1: ("vision", 8 * GiB)})
    assert set(verdicts) == {2}
    assert verdicts[2] == (
        "project storage limit reached: project vision's running jobs used 12 GiB of its 8 GiB storage total; this job used the most (5 GiB): stopped"
    )
    verdicts = storage_verdicts(uses, job_limit=None, project_limits={1: ("vision", 3 * GiB)})
    assert set(verdicts) == {2, 3} and "used the most of those left (4 GiB)" in verdicts[3]


def test_a_run_over_its_own_limit_counts_off_its_projects_total_first():
    uses = [use(1, 11 * GiB), use(2, 2 * GiB)]
    verdicts = storage_verdicts(uses, job_limit=10 * GiB, project_limits={1: ("vision", 5 * GiB)})
    assert set(verdicts) == {1} and verdicts[1].startswith("storage limit reached")


def test_sizes_read_as_a_person_writes_them():
    assert [format_storage(n) for n in (10 * GiB, int(10.44 * GiB), int(51.2 * MiB), 1536, 10)] == [
        "10 GiB",
        "10.4 GiB",
        "51.2 MiB",
        "1.5 KiB",
        "10 bytes",
    ]


# --- the stop and the job's end -------------------------------------------------------------------
@pytest.fixture
def running(nodes, make_job):
    def start(**fields):
        job = make_job(**fields)
        place_waiting_jobs()
        attempt = JobAttempt.objects.get(job=job)
        for part in attempt.placements.all():
            runs.part_started(part, runner_pid=4242, workdir="/nowhere")
        job.refresh_from_db()
        assert job.status == JobStatus.RUNNING
        return job, JobAttempt.objects.get(job=job)

    return start


@pytest.mark.django_db
def test_a_run_over_its_limit_ends_failed_never_failed_over(running, settings):
    settings.JOB_STORAGE_LIMIT_GIB = 0.05
    job, attempt = running(failover_enabled=True)
    assert runs.storage_measured([StorageUse(job.pk, job.project_id, attempt.pk, 60 * MiB)]) == [attempt.pk]
    attempt.refresh_from_db()
    assert attempt.cause.startswith("storage limit reached: used 60 MiB of its 51.2 MiB storage limit")
    assert attempt.stop_requested_at is not None
    assert runs.storage_measured([StorageUse(job.pk, job.project_id, attempt.pk, 70 * MiB)]) == []  # once
    runs.part_exited(attempt.placements.get(), exited(None, 9))
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and job.failover_count == 0
    assert job.status_reason == attempt.cause
    assert JobEvent.objects.filter(job=job, to_status=JobStatus.FAILED, reason=attempt.cause).exists()


@pytest.mark.django_db
def test_a_run_under_its_limit_goes_on(running, settings):
    settings.JOB_STORAGE_LIMIT_GIB = 0.05
    job, attempt = running()
    assert runs.storage_measured([StorageUse(job.pk, job.project_id, attempt.pk, 50 * MiB)]) == []
    attempt.refresh_from_db()
    assert attempt.cause == "" and attempt.stop_requested_at is None


@pytest.mark.django_db
def test_the_largest_user_of_a_project_over_its_total_ends_with_a_reason_that_says_so(running, settings, project):
    settings.JOB_STORAGE_LIMIT_GIB = 0
    project.storage_limit_gib = 1
    project.save(update_fields=["storage_limit_gib"])
    small, small_attempt = running()
    large, large_attempt = running()
    uses = [StorageUse(small.pk, project.pk, small_attempt.pk, 400 * MiB), StorageUse(large.pk, project.pk, large_attempt.pk, 700 * MiB)]
    assert runs.storage_measured(uses) == [large_attempt.pk]
    runs.part_exited(large_attempt.placements.get(), exited(None, 9))
    large.refresh_from_db()
    assert large.status == JobStatus.FAILED
    assert large.status_reason == (
        f"project storage limit reached: project {project.name}'s running jobs used 1.1 GiB of its 1 GiB storage total; "
        "this job used the most (700 MiB): stopped"
    )
    small.refresh_from_db()
    assert small.status == JobStatus.RUNNING


class RecordingLauncher:
    def __init__(self) -> None:
        self.sent: list[tuple[int, int]] = []

    def signal(self, part, sig: int) -> bool:
        self.sent.append((part.pk, sig))
        return True


@pytest.mark.django_db
def test_the_agent_kills_at_once_the_runs_the_control_plane_ends(running, settings):
    settings.JOB_STORAGE_LIMIT_GIB = 0.05
    over, over_attempt = running()
    under, under_attempt = running()
    parts = [a.placements.select_related("attempt__job", "node").get() for a in (over_attempt, under_attempt)]
    launcher = RecordingLauncher()
    agent = SimpleNamespace(name="test", node_names=["node-a"], signal=launcher.signal, live_parts=lambda: parts)
    watch = storage.StorageWatch(agent)
    watch.enforce([StorageUse(over.pk, over.project_id, over_attempt.pk, 60 * MiB), StorageUse(under.pk, under.project_id, under_attempt.pk, MiB)])
    assert launcher.sent == [(parts[0].pk, signal.SIGKILL)]


@pytest.mark.django_db
def test_a_job_is_measured_over_its_work_and_output_directories_and_its_layer(running, settings, tmp_path):
    job, attempt = running()
    work = write(Path(settings.JOB_WORK_ROOT) / str(job.pk) / "work" / "w", MiB)
    output = write(Path(settings.JOB_WORK_ROOT) / str(job.pk) / "output" / "o", MiB)
    write(Path(settings.JOB_WORK_ROOT) / str(job.pk) / "attempt-1" / "rank-0" / "records", 4 * MiB)  # the platform's, not counted
    layer = write(tmp_path / "layer" / "var" / "tmp" / "fill", 2 * MiB)
    parts = list(attempt.placements.select_related("attempt__job", "node"))
    (trees,) = storage.job_trees(parts, {})
    assert trees.trees == [Tree(Path(settings.JOB_WORK_ROOT), (str(job.pk), "work")), Tree(Path(settings.JOB_WORK_ROOT), (str(job.pk), "output"))]
    trees.containers = [(parts[0].pk, "sac-test")]
    watch = storage.StorageWatch(SimpleNamespace(name="test", node_names=[], live_parts=lambda: parts))
    watch.layers[(parts[0].pk, "sac-test")] = tmp_path / "layer"
    used = watch.measure_job(trees)
    files = sum(allocated(p) for p in (work, output, layer))
    directories = dirs_below(work.parent) + dirs_below(output.parent) + dirs_below(tmp_path / "layer")
    assert used == StorageUse(job.pk, job.project_id, attempt.pk, files + directories)


# --- a real job in its container ------------------------------------------------------------------
FILLER = (
    'python -c "import os, sys, time\n'
    "with open(os.path.join(os.path.expandvars(sys.argv[1]), 'fill'), 'wb') as f:\n"
    "    for _ in range(100):\n"
    "        f.write(os.urandom(1 << 20))\n"
    "    f.flush(); os.fsync(f.fileno())\n"
    "print('written', flush=True)\n"
    'time.sleep(600)" '
)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@needs_sandbox
@pytest.mark.parametrize("where", ["/var/tmp", "/job/work", "$OUTPUT_DIR"], ids=["image-layer", "work-dir", "output-dir"])
def test_a_job_writing_past_its_limit_is_stopped_with_the_reason(make_job, drive, settings, where):
    settings.JOB_STORAGE_LIMIT_GIB = 0.05
    settings.JOB_STORAGE_CHECK_INTERVAL = 0.5
    job = drive(make_job(command=FILLER + shlex.quote(where), failover_enabled=True), {JobStatus.FAILED, JobStatus.COMPLETED}, timeout=180)
    assert job.status == JobStatus.FAILED, job.status_reason
    assert job.status_reason.startswith("storage limit reached: used "), job.status_reason
    assert job.status_reason.endswith(" of its 51.2 MiB storage limit (work and output directories and the container's own files): stopped")
    assert job.failover_count == 0
    assert JobEvent.objects.filter(job=job, to_status=JobStatus.FAILED, reason=job.status_reason, actor="node-agent").exists()
