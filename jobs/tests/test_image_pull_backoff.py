"""Images are OCI references the node pulls from a registry (real Podman, real docker-registry):
a failed pull puts the job in ``Pending - imagepullbackoff`` with the registry's own words and
exponential back-off; the digest that ran is on the attempt, and a failover runs the same one."""
from __future__ import annotations

import socket
import subprocess
from datetime import timedelta

import pytest
from django.utils import timezone

from agent import engine, runfiles
from console.testing import ENGINE_ROOT, default_image_ready, job_output, needs_sandbox
from jobs.models import GPU, JobAttempt, JobEvent, Registry, RegistryCredential, TrainingJob
from jobs.statuses import JobStatus

pytestmark = pytest.mark.django_db


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
        back_off_image_pull(job, "image x could not be pulled: manifest unknown")
        job.refresh_from_db()
        delays.append(round((job.next_retry_at - timezone.now()).total_seconds()))
    assert delays == [10, 20, 30, 30]
    assert job.pull_attempts == 4
    assert JobEvent.objects.filter(job=job, to_status=JobStatus.IMAGE_PULL_BACKOFF).status_changes().count() == 1
    # Each later retry is in the history too, with its reason.
    assert JobEvent.objects.filter(job=job, from_status=JobStatus.IMAGE_PULL_BACKOFF, to_status=JobStatus.IMAGE_PULL_BACKOFF).count() == 3


@needs_sandbox
@pytest.mark.slow
def test_a_job_on_the_default_image_runs_and_its_attempt_shows_the_digest(make_job, drive, default_ref):
    job = drive(make_job(command="python -c 'import torch; print(torch.__version__)'"), JobStatus.COMPLETED, timeout=120)
    attempt = JobAttempt.objects.get(job=job)
    assert attempt.image_digest.startswith(default_ref.rsplit(":", 1)[0] + "@sha256:")
    assert job_output(job) == ["2.13.0+cpu"]
    from logs.models import LogLine

    log = list(LogLine.objects.filter(job=job).order_by("seq").values_list("text", flat=True))
    # The environment being prepared, as the guide's log shows it: the pull, ckptlib, ready.
    assert log[0].startswith("[console] pull: Trying to pull 127.0.0.1:5000/pytorch:2.13-py3.11")
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
    assert JobAttempt.objects.get(job=job).state == JobAttempt.State.ABANDONED
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
    subprocess.run([*podman, "rm", tmp], capture_output=True, timeout=60)
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
