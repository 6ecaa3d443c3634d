"""Checkpointless failover on the embedded agent: every step's state goes to another node's
memory, and a re-placed attempt resumes from it (``agent.checkpointless``, ``agent.replicas``)."""

from __future__ import annotations

import io
import re
import tarfile
import time

import pytest

from agent import checkpointless, replicas
from agent.checkpointless import Hub
from agent.models import Replica, ReplicaEndpoint
from failover.services.faults import inject_fault
from harness.job_factory import job_output
from harness.node_agent import pump_until
from jobs.models import JobAttempt, JobEvent
from jobs.services.actions import request_stop
from jobs.statuses import TERMINAL, JobStatus

TRAINING = "python -m jobs.examples.train_ckpt --steps {steps} --save-every {save} --sleep {sleep}"
STEP = re.compile(r"^step (\d+)/\d+ loss (\S+)$")


# --- the store and its door (no process, no socket) ----------------------------------------------
def test_the_store_keeps_the_newest_two_steps_per_rank_and_the_jobs_memory_limit():
    store = replicas.ReplicaStore(kept=2)
    for step in (3, 4, 5):
        store.put(7, 0, step, b"x" * 10, job_limit=100)
    assert store.get(7, 0, 3) is None and store.get(7, 0, 5) == b"x" * 10
    store.put(7, 1, 5, b"y" * 50, job_limit=100)
    with pytest.raises(replicas.ReplicaUnavailable, match="memory limit"):
        store.put(7, 1, 6, b"z" * 60, job_limit=100)
    assert store.get(7, 1, 6) is None and store.get(7, 1, 5) == b"y" * 50  # the refused one left nothing
    assert store.drop_job(7) == 70 and store.jobs() == set()


def test_a_request_is_answered_only_signed_for_its_own_path_and_recent():
    path = "/replicas/7/0/5"
    header = replicas.signed("GET", path)
    assert replicas.signature_ok("GET", path, header)
    assert not replicas.signature_ok("GET", "/replicas/8/0/5", header)  # another job's replica
    assert not replicas.signature_ok("PUT", path, header)
    assert not replicas.signature_ok("GET", path, "")
    old = int(time.time()) - replicas.SIGNATURE_SKEW_S - 5
    assert not replicas.signature_ok("GET", path, f"{old}:{replicas.replica_signature('GET', path, old)}")


@pytest.mark.django_db
def test_another_jobs_replicas_are_never_a_jobs_resume_point(make_job, nodes):
    mine, theirs = make_job(), make_job()
    for job in (mine, theirs):
        JobAttempt.objects.create(job=job, number=1, state=JobAttempt.State.EXITED)
    second = JobAttempt.objects.create(job=mine, number=2)
    first_of_theirs = JobAttempt.objects.get(job=theirs, number=1)
    Replica.objects.create(job=theirs, attempt=first_of_theirs, rank=0, step=90, holder=nodes[1], size=1, sha256="0" * 64)
    chosen = checkpointless.choose(mine, second, [], 20, contained=False)
    assert (chosen.step, chosen.source) == (20, "disk")
    assert "no replica" in chosen.detail


# --- end to end on the embedded agent (real runs) --------------------------------------------------
@pytest.fixture
def hub(agent, nodes, settings, tmp_path):
    settings.SNAPSHOT_ROOT = tmp_path / "shm"
    store, address = replicas.serve()
    for node in nodes:
        ReplicaEndpoint.objects.update_or_create(node=node, defaults={"address": address})
    made = Hub()
    made.store = store
    made.agents = [agent]
    yield made
    for job in list(store.jobs()):
        store.drop_job(job)


def run_until(agent, hub: Hub, condition, *, timeout: float = 90.0, what: str = "condition"):
    """The agent's rounds and the replication thread's work, in this thread (the test's database)."""
    pump_until(agent, condition, what, timeout=timeout, every=0.02, also=hub.ship_all)


def losses(lines: list[str]) -> list[tuple[int, str]]:
    return [(int(m.group(1)), m.group(2)) for m in map(STEP.match, lines) if m]


def failed_over(agent, hub, job, *, after_replica_step: int, tamper=None) -> tuple[JobAttempt, list[str]]:
    run_until(agent, hub, lambda: Replica.objects.filter(job=job, step__gte=after_replica_step).exists(), what="a replica")
    first = JobAttempt.objects.get(job=job, number=1).placements.get().node
    holder = Replica.objects.filter(job=job).first().holder
    assert holder != first  # another node's memory
    if tamper is not None:
        tamper(job)
    inject_fault(first, gpu=0, xid=79, actor="test")
    run_until(agent, hub, lambda: job.__class__.objects.get(pk=job.pk).status == JobStatus.COMPLETED, timeout=180, what="the job's end")
    return JobAttempt.objects.get(job=job, number=2), job_output(job, stream="master")


@pytest.mark.slow
@pytest.mark.django_db
def test_a_gpu_fault_resumes_from_the_replica_and_the_losses_go_on_bit_for_bit(make_job, agent, hub):
    job = make_job(command=TRAINING.format(steps=120, save=1000, sleep=0.05), gpus_per_node=1)
    second, lines = failed_over(agent, hub, job, after_replica_step=25)

    assert (second.resume_source, second.resume_step is not None) == ("replica", True)
    step = second.resume_step
    assert step >= 25  # no disk checkpoint was ever committed: the disk had nothing
    assert "held in memory on node-" in second.resume_detail
    assert f"[satrain] attempt 2 continues from the in-memory replica of step {step}: " in "\n".join(lines)
    assert f"[Concurrent Checkpoint] resuming from the in-memory replica step={step}" in "\n".join(lines)
    # The same steps give the same losses, bit for bit, before and after the fault.
    cut = lines.index(next(line for line in lines if line.startswith("[satrain] attempt 2 continues from")))
    first_run = dict(losses(lines[:cut]))
    second_run = dict(losses(lines[cut:]))
    assert min(second_run) == step + 1
    overlap = sorted(set(first_run) & set(second_run))
    assert all(first_run[s] == second_run[s] for s in overlap), [(s, first_run[s], second_run[s]) for s in overlap]
    lost = max(first_run) - step
    assert f"{lost} step{'s' if lost != 1 else ''} lost" in second.resume_detail
    # The job's header and the log's banner between the attempts say it too.
    running = JobEvent.objects.filter(job=job, to_status="Running").order_by("id").last()
    assert running.reason.endswith(f"; resuming from the in-memory replica of step {step}, {lost} step{'s' if lost != 1 else ''} lost")
    # The replicas end with the job.
    hub.sweep()
    assert not Replica.objects.filter(job=job).exists() and job.pk not in hub.store.jobs()


@pytest.mark.slow
@pytest.mark.django_db
def test_a_damaged_replica_is_refused_with_its_reason_and_the_disk_checkpoint_is_used(make_job, agent, hub):
    def flip_a_byte(job):
        row = Replica.objects.filter(job=job).order_by("-step").first()
        data = bytearray(hub.store.get(job.pk, 0, row.step))
        data[len(data) // 2] ^= 0xFF
        hub.store.held[(job.pk, 0)][row.step] = bytes(data)
        hub.stopped_shipping = True

    # A replica of step 23 or later, then the fault: the run must not reach its disk save of step
    # 40 before the fault stops it (at 0.25 s a step, 4 s of room for a loaded machine), or the
    # disk is the newer state and no replica is even looked at.
    job = make_job(command=TRAINING.format(steps=45, save=20, sleep=0.25), gpus_per_node=1)
    original = Hub.ship

    def ship_until_tampered(self, part):
        if not getattr(self, "stopped_shipping", False):
            original(self, part)

    hub.ship = ship_until_tampered.__get__(hub)
    second, lines = failed_over(agent, hub, job, after_replica_step=23, tamper=flip_a_byte)

    assert second.resume_source == "disk"
    assert "was refused" in second.resume_detail and "checksum" in second.resume_detail
    assert f"Resumed from checkpoint step {second.resume_step}" in lines


@pytest.mark.slow
@pytest.mark.django_db
def test_a_short_snapshot_file_is_refused_by_the_check_as_ckptlib_checks(make_job, agent, hub, tmp_path):
    job = make_job(command=TRAINING.format(steps=1000, save=1000, sleep=0.05), gpus_per_node=1)
    run_until(agent, hub, lambda: Replica.objects.filter(job=job, step__gte=3).exists(), what="a replica")
    row = Replica.objects.filter(job=job).order_by("-step").first()
    rebuilt = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(hub.store.get(job.pk, 0, row.step))) as archive, tarfile.open(fileobj=rebuilt, mode="w") as out:
        for member in archive.getmembers():
            data = archive.extractfile(member).read() if member.isfile() else None
            if data is not None and len(data) > 100 and not member.name.endswith(".json"):
                data = data[: len(data) // 2]  # a short file, shipped with a record that matches it
                member.size = len(data)
            out.addfile(member, io.BytesIO(data) if data is not None else None)
    hub.store.held[(job.pk, 0)][row.step] = rebuilt.getvalue()
    Replica.objects.filter(pk=row.pk).update(size=len(rebuilt.getvalue()), sha256=replicas.digest(rebuilt.getvalue()))
    row.refresh_from_db()
    with pytest.raises(checkpointless.ReplicaRefused, match="damaged"):
        checkpointless.stage_replica(job, row, tmp_path)
    request_stop(job, actor="test")
    run_until(agent, hub, lambda: job.__class__.objects.get(pk=job.pk).status in TERMINAL, what="the stop")


@pytest.mark.slow
@pytest.mark.django_db
def test_a_two_node_job_resumes_only_from_a_step_every_rank_has(make_job, agent, hub):
    # A step both ranks have a replica of: the ranks do not wait on each other, and each shipping
    # pass sends a rank's newest snapshot, so on a loaded machine (passes seconds apart) their
    # shipped steps may never meet. Snapshots every 5 steps (0.25 s apart) make them meet.
    job = make_job(command="CKPT_SNAPSHOT_EVERY=5 " + TRAINING.format(steps=100, save=1000, sleep=0.05), gpus_per_node=1, node_count=2)
    run_until(agent, hub, lambda: (checkpointless.newest_whole_step(job) or 0) >= 20, what="a step both ranks' replicas hold")
    nodes = set(JobAttempt.objects.get(job=job, number=1).placements.values_list("node__name", flat=True))
    assert set(Replica.objects.filter(job=job).values_list("holder__name", flat=True)).isdisjoint(nodes)
    inject_fault(JobAttempt.objects.get(job=job, number=1).placements.get(rank=1).node, gpu=0, xid=79, actor="test")
    run_until(agent, hub, lambda: job.__class__.objects.get(pk=job.pk).status == JobStatus.COMPLETED, timeout=180, what="the job's end")

    second = JobAttempt.objects.get(job=job, number=2)
    assert second.resume_source == "replica", second.resume_detail
    for stream in ("master", "worker-1"):
        lines = job_output(job, stream=stream)
        cut = next(i for i, line in enumerate(lines) if line.startswith("[satrain] attempt 2 continues from"))
        assert min(dict(losses(lines[cut:]))) == second.resume_step + 1, stream


def test_the_store_keeps_a_ranks_older_steps_down_to_the_newest_step_every_rank_has():
    store = replicas.ReplicaStore(kept=2)
    for step in range(50, 60):
        store.put(7, 0, step, b"x", job_limit=100, keep_from=52)  # rank 1 stopped at 52
    assert sorted(store.held[(7, 0)]) == list(range(52, 60))
    for step in range(60, 80):
        store.put(7, 0, step, b"x", job_limit=100, keep_from=52)
    # Bounded whatever the spread, and the step every rank has is never the one pushed out.
    assert sorted(store.held[(7, 0)]) == [52, *range(80 - replicas.MAX_HELD_PER_RANK + 1, 80)]
    # The next attempt resumed from 52: what the failed one held past its step is another run's.
    store.put(7, 0, 53, b"y", job_limit=100, keep_from=52)
    assert sorted(store.held[(7, 0)]) == [52, 53] and store.get(7, 0, 53) == b"y"


@pytest.mark.slow
@pytest.mark.django_db
def test_a_snapshot_directory_a_job_turned_into_links_ships_nothing(make_job, agent, hub):
    hostile = (
        'ln -s / "$CKPT_SNAPSHOT_DIR/rank-0"; mkdir -p /tmp/x/concurrent_checkpoint; '
        "echo 5 > /tmp/x/concurrent_checkpoint/latest; echo Starting dataset initialization; sleep 30"
    )
    job = make_job(command=hostile, gpus_per_node=1)
    run_until(agent, hub, lambda: "Starting dataset initialization" in job_output(job, stream="master"), what="the run")
    for _ in range(20):
        hub.ship_all()
    assert not Replica.objects.filter(job=job).exists() and job.pk not in hub.store.jobs()
    request_stop(job, actor="test")
    run_until(agent, hub, lambda: job.__class__.objects.get(pk=job.pk).status in TERMINAL, what="the stop")
