"""Images are OCI references the node pulls from a registry (real Podman, real docker-registry):
a failed pull puts the job in ``Pending - imagepullbackoff`` with the registry's own words and
exponential back-off; it stays there, one event saying why, until a pull succeeds; a pull that
never started the run is no attempt of the job; the digest that ran is on the attempt, and a
failover runs the same one."""

from __future__ import annotations

import subprocess
from datetime import timedelta

import pytest
from django.utils import timezone

from agent import engine, runfiles
from harness.job_factory import job_output
from harness.processes import free_port
from harness.sandbox import ENGINE_ROOT, default_image_ready, needs_sandbox
from jobs.models import GPU, JobAttempt, JobEvent, Registry, RegistryCredential, TrainingJob
from jobs.statuses import JobStatus

pytestmark = pytest.mark.django_db


def copy_image(source: str, target: str, *, creds: str | None = None) -> None:
    argv = [*engine.podman_argv(ENGINE_ROOT, "skopeo"), "copy", "--quiet", "--src-tls-verify=false", "--dest-tls-verify=false"]
    if creds:
        argv += ["--dest-creds", creds]
    subprocess.run([*argv, f"docker://{source}", f"docker://{target}"], check=True, capture_output=True, timeout=600)


@pytest.fixture
def default_ref(settings) -> str:
    return default_image_ready()["alias"]


@pytest.fixture
def registry(tmp_path_factory, default_ref):
    """A registry of the test's own on loopback, holding the default image as team/app:v1."""
    name = f"reg-{free_port()}"
    address = engine.ensure_registry(ENGINE_ROOT, free_port(), name=name)
    copy_image(default_ref, f"{address}/team/app:v1")
    Registry.objects.create(host=address)
    yield address, name
    engine.stop_registry(ENGINE_ROOT, name=name)


def test_retries_back_off_exponentially_up_to_the_cap(make_job, nodes, settings):
    from jobs.services.placement import back_off_image_pull

    settings.IMAGE_PULL_BACKOFF_BASE = 10
    settings.IMAGE_PULL_BACKOFF_MAX = 30
    job = make_job()
    delays = []
    for _ in range(4):
        back_off_image_pull(job.pk, "image x could not be pulled: manifest unknown")
        job.refresh_from_db()
        delays.append(round((job.next_retry_at - timezone.now()).total_seconds()))
    assert delays == [10, 20, 30, 30]
    assert job.pull_attempts == 4
    assert job.status_reason == "image x could not be pulled: manifest unknown; retry 4 in 30s"
    # One event says why; the retries that fail the same way update its reason in place.
    backoffs = JobEvent.objects.filter(job=job, to_status=JobStatus.IMAGE_PULL_BACKOFF).order_by("id")
    assert [e.reason for e in backoffs] == ["image x could not be pulled: manifest unknown; retry 1 in 10s"]
    # A retry that fails another way says so in an event of its own.
    back_off_image_pull(job.pk, "image x could not be pulled: connection refused")
    assert [e.reason for e in backoffs.all()][1:] == ["image x could not be pulled: connection refused; retry 5 in 30s"]


def hold_and_fail_the_pull(job, why="image team/app:v9 could not be pulled: manifest unknown"):
    """A placement round places the job; its node's pull fails (what the agent reports)."""
    from jobs.services import runs
    from jobs.services.placement import place_waiting_jobs

    (attempt,) = place_waiting_jobs()
    claimed = runs.claim_parts(attempt, list(attempt.placements.values_list("node__name", flat=True)))
    runs.image_unavailable(attempt, claimed, why)
    return attempt.number


def test_pull_retries_stay_in_back_off_with_one_event_and_no_new_attempt(make_job, nodes, settings):
    from jobs.services import runs
    from jobs.services.placement import place_waiting_jobs

    settings.IMAGE_PULL_BACKOFF_BASE = 10
    job = make_job(image="team/app:v9")
    numbers = []
    for retry in range(3):
        numbers.append(hold_and_fail_the_pull(job))
        job.refresh_from_db()
        assert job.status == JobStatus.IMAGE_PULL_BACKOFF
        assert job.status_reason.endswith(f"manifest unknown; retry {retry + 1} in {10 * 2**retry}s")
        assert not JobAttempt.objects.filter(job=job).exists()  # no attempt, GPUs free meanwhile
        assert not GPU.objects.filter(allocated_to__isnull=False).exists()
        TrainingJob.objects.filter(pk=job.pk).update(next_retry_at=timezone.now() - timedelta(seconds=1))
    assert numbers == [1, 1, 1]  # each retry is placed as attempt 1 again

    # The next retry is placed and, while its node pulls, the job still says why it waits.
    (attempt,) = place_waiting_jobs()
    job.refresh_from_db()
    assert (job.status, attempt.number) == (JobStatus.IMAGE_PULL_BACKOFF, 1)
    assert job.status_reason.startswith("image team/app:v9 could not be pulled: manifest unknown; retry 3: pulling again on node-")
    part = runs.claim_parts(attempt, [attempt.placements.get().node.name])[0]
    runs.image_pulled(attempt, part, "127.0.0.1:5000/team/app@sha256:" + "a" * 64)
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING
    assert job.status_reason == (
        f"image team/app:v9 is available: pulled as 127.0.0.1:5000/team/app@sha256:{'a' * 64} on {part.node.name} after 3 failed pulls; starting attempt 1"
    )
    assert (job.pull_attempts, job.next_retry_at, job.failover_count) == (0, None, 0)
    history = [(e.from_status, e.to_status, e.attempt) for e in JobEvent.objects.filter(job=job).order_by("id")]
    assert history == [
        ("", JobStatus.PENDING, None),
        (JobStatus.PENDING, JobStatus.PENDING, 1),  # placed on …; starting
        (JobStatus.PENDING, JobStatus.IMAGE_PULL_BACKOFF, None),
        (JobStatus.IMAGE_PULL_BACKOFF, JobStatus.PENDING, 1),  # the image is available
    ]


def test_a_due_retry_waiting_for_gpus_keeps_its_pull_failure_in_the_reason(make_job, nodes, settings):
    from jobs.services.placement import place_waiting_jobs

    job = make_job(image="team/app:v9")
    hold_and_fail_the_pull(job)
    TrainingJob.objects.filter(pk=job.pk).update(next_retry_at=timezone.now() - timedelta(seconds=1))
    GPU.objects.update(healthy=False)
    assert not place_waiting_jobs()
    job.refresh_from_db()
    assert job.status == JobStatus.IMAGE_PULL_BACKOFF
    assert job.status_reason.startswith("image team/app:v9 could not be pulled: manifest unknown; retry 1 due, "), job.status_reason
    assert JobEvent.objects.filter(job=job).count() == 3  # created, placed, the back-off


def test_a_multi_node_placement_another_agent_holds_a_rank_of_is_abandoned_not_forgotten(make_job, nodes, settings):
    from jobs.services import runs
    from jobs.services.placement import place_waiting_jobs

    job = make_job(image="team/app:v9", node_count=2)
    (attempt,) = place_waiting_jobs()
    first, second = attempt.placements.order_by("rank").select_related("node")
    runs.claim_parts(attempt, [second.node.name])  # the other node's agent is starting its rank
    runs.image_unavailable(attempt, runs.claim_parts(attempt, [first.node.name]), "image team/app:v9 could not be pulled: manifest unknown")
    attempt.refresh_from_db()
    assert attempt.state == JobAttempt.State.ABANDONED  # that agent sees it ended and ends its rank
    assert not GPU.objects.filter(allocated_to__isnull=False).exists()
    job.refresh_from_db()
    assert job.status == JobStatus.IMAGE_PULL_BACKOFF


@needs_sandbox
@pytest.mark.slow
def test_a_job_on_the_default_image_runs_and_its_attempt_shows_the_digest(make_job, drive, default_ref, settings):
    job = drive(make_job(command="python -c 'import torch; print(torch.__version__)'"), JobStatus.COMPLETED, timeout=120)
    attempt = JobAttempt.objects.get(job=job)
    assert attempt.image_digest.startswith(default_ref.rsplit(":", 1)[0] + "@sha256:")
    assert job_output(job) == ["2.13.0+cpu"]
    from logs.models import LogLine

    log = list(LogLine.objects.filter(job=job).order_by("seq").values_list("text", flat=True))
    # The environment being prepared, as the guide's log shows it: the pull, ckptlib, ready.
    assert log[0].startswith(f"[console] pull: Trying to pull {settings.DEFAULT_REGISTRY}/pytorch:2.13-py3.11")
    pulled = next(i for i, line in enumerate(log) if line.startswith(f"[console] image {job.image} pulled (sha256:"))
    assert all(line.startswith("[console] pull: ") for line in log[:pulled])
    assert log[pulled + 1].startswith("[INFO] Concurrent Checkpoint library is installed")
    assert log[pulled + 2] == "[console] environment ready: starting the command"


@needs_sandbox
@pytest.mark.slow
def test_a_missing_tag_backs_off_with_the_registrys_words_and_frees_the_gpus(make_job, drive, settings):
    settings.IMAGE_PULL_BACKOFF_BASE = 30
    job = drive(make_job(image="team/trainer:v2", gpus_per_node=2), JobStatus.IMAGE_PULL_BACKOFF, timeout=60)
    assert "manifest unknown" in job.status_reason, job.status_reason
    assert job.status_reason.startswith("image team/trainer:v2 could not be pulled: ")
    assert not JobAttempt.objects.filter(job=job).exists()  # no process started: no attempt
    assert not GPU.objects.filter(allocated_to__isnull=False).exists()


@needs_sandbox
@pytest.mark.slow
def test_a_private_repository_wants_its_credentials(make_job, drive, settings, project, default_ref):
    settings.IMAGE_PULL_BACKOFF_BASE = 0.2
    htpasswd = engine.write_htpasswd(ENGINE_ROOT / "private-test" / "htpasswd", {"alice": "correct horse"})
    address = engine.ensure_registry(ENGINE_ROOT, free_port(), name="private-test", htpasswd=htpasswd)
    try:
        copy_image(default_ref, f"{address}/team/secret:v1", creds="alice:correct horse")
        registry = Registry.objects.create(host=address)
        job = drive(make_job(image=f"{address}/team/secret:v1", command="echo ran"), JobStatus.IMAGE_PULL_BACKOFF, timeout=60)
        assert "unauthorized" in job.status_reason, job.status_reason
        RegistryCredential.objects.create(registry=registry, project=project, username="alice", password="correct horse")
        TrainingJob.objects.filter(pk=job.pk).update(next_retry_at=timezone.now() - timedelta(seconds=1))
        job = drive(job, JobStatus.COMPLETED, timeout=120)
        assert job_output(job) == ["ran"]
        # The credential is never in the job's environment, its log or its run's spec.
        from agent.processes import run_dir
        from jobs.models import AttemptNode

        part = AttemptNode.objects.filter(attempt__job=job).order_by("-attempt__number").first()
        assert "correct horse" not in (run_dir(part) / runfiles.SPEC_FILE).read_text()
        assert not any("correct horse" in line for line in job_output(job))
    finally:
        engine.stop_registry(ENGINE_ROOT, name="private-test")


@needs_sandbox
@pytest.mark.slow
def test_a_stopped_registry_backs_off_then_the_job_runs_when_it_is_back(make_job, drive, settings, registry):
    address, name = registry
    settings.IMAGE_PULL_BACKOFF_BASE = 0.5
    engine.stop_registry(ENGINE_ROOT, name=name)
    job = drive(make_job(image=f"{address}/team/app:v1", command="echo back"), JobStatus.IMAGE_PULL_BACKOFF, timeout=60)
    assert "connection refused" in job.status_reason, job.status_reason
    engine.ensure_registry(ENGINE_ROOT, int(address.rsplit(":", 1)[1]), name=name)
    job = drive(job, JobStatus.COMPLETED, timeout=120)
    assert job_output(job) == ["back"]


@needs_sandbox
@pytest.mark.slow
def test_a_tag_pushed_after_several_retries_runs_as_attempt_1_with_one_back_off_event(make_job, drive, settings, registry, default_ref):
    address, _ = registry
    settings.IMAGE_PULL_BACKOFF_BASE = 0.3
    settings.IMAGE_PULL_BACKOFF_MAX = 0.3
    job = drive(make_job(image=f"{address}/team/app:v2", command="echo ran"), JobStatus.IMAGE_PULL_BACKOFF, timeout=60)
    deadline = timezone.now() + timedelta(seconds=90)
    while job.pull_attempts < 4:  # several retries, each failing the same way
        assert timezone.now() < deadline, job.status_reason
        job = drive(job, set(JobStatus) - {JobStatus.PENDING, JobStatus.RUNNING}, timeout=30)
        assert job.status == JobStatus.IMAGE_PULL_BACKOFF, job.status_reason
        assert "manifest unknown" in job.status_reason, job.status_reason
    assert not JobAttempt.objects.filter(job=job, state__in=[JobAttempt.State.RUNNING, JobAttempt.State.EXITED]).exists()

    pushed = timezone.now()
    copy_image(default_ref, f"{address}/team/app:v2")
    job = drive(job, JobStatus.COMPLETED, timeout=120)
    assert job_output(job) == ["ran"]

    events = list(JobEvent.objects.filter(job=job).order_by("id"))
    backoffs = [e for e in events if e.to_status == JobStatus.IMAGE_PULL_BACKOFF]
    assert len(backoffs) == 1 and backoffs[0].from_status == JobStatus.PENDING
    assert "manifest unknown" in backoffs[0].reason and backoffs[0].reason.endswith("; retry 1 in 0s")
    (available,) = [e for e in events if e.from_status == JobStatus.IMAGE_PULL_BACKOFF]
    assert available.to_status == JobStatus.PENDING and available.created_at >= pushed
    assert available.reason.startswith(f"image {address}/team/app:v2 is available: pulled as {address}/team/app@sha256:")
    assert " failed pulls; starting attempt 1" in available.reason
    assert not any("retrying" in e.reason or "pulling again" in e.reason for e in events)
    # The run is attempt 1: the pulls that never started it were no attempts, nor failovers.
    (attempt,) = JobAttempt.objects.filter(job=job)
    assert (attempt.number, attempt.state) == (1, JobAttempt.State.EXITED)
    running = next(e for e in events if e.to_status == JobStatus.RUNNING)
    assert running.attempt == 1 and running.reason.startswith("attempt 1 running on ")
    assert job.failover_count == 0


@needs_sandbox
@pytest.mark.slow
def test_a_failover_runs_the_digest_the_first_attempt_ran(make_job, drive, settings, registry, agent):
    from failover.services.faults import inject_fault

    address, _ = registry
    reference = f"{address}/team/app:v1"
    job = drive(make_job(image=reference, command="cat /etc/debian_version; ls /moved 2>&1; sleep 600"), JobStatus.RUNNING, timeout=120)
    first = JobAttempt.objects.get(job=job, number=1)
    # The tag moves to another image while the job runs.
    tmp = f"moved-{job.pk}"
    podman = engine.podman_argv(ENGINE_ROOT)
    subprocess.run([*podman, "run", "--name", tmp, "--network=none", first.image_digest, "touch", "/moved"], check=True, capture_output=True, timeout=120)
    subprocess.run([*podman, "commit", "--quiet", tmp, reference], check=True, capture_output=True, timeout=300)
    subprocess.run([*podman, "rm", tmp], check=False, capture_output=True, timeout=60)
    subprocess.run([*podman, "push", "--quiet", "--tls-verify=false", reference], check=True, capture_output=True, timeout=300)
    inject_fault(first.placements.get().node, gpu=first.placements.get().gpu_indices[0], xid=79, actor="test")
    deadline = timezone.now() + timedelta(seconds=120)
    while not JobAttempt.objects.filter(job=job, number=2, started_at__isnull=False).exists():
        assert timezone.now() < deadline, "no second attempt"
        drive(job, {JobStatus.RUNNING, JobStatus.FAILOVER_IN_PROGRESS, JobStatus.PENDING}, timeout=5)
    second = JobAttempt.objects.get(job=job, number=2)
    assert second.image_digest == first.image_digest
    moved = engine.resolve_digest(ENGINE_ROOT, reference)
    assert moved.ok and moved.digest not in first.image_digest  # the tag did move
    from logs.models import LogLine

    def lines_of(number):
        return [t for t in LogLine.objects.filter(job=job, attempt=number).values_list("text", flat=True) if "moved" in t]

    drive(job, JobStatus.RUNNING, timeout=60)
    deadline = timezone.now() + timedelta(seconds=60)
    while not lines_of(2):
        assert timezone.now() < deadline
        drive(job, JobStatus.RUNNING, timeout=5)
    assert "No such file or directory" in lines_of(2)[0]  # not the moved tag's image
    from jobs.services.actions import request_stop

    request_stop(job, actor="test")
