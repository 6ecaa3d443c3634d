"""Health is per GPU where NVIDIA's catalogue fixes the fault with a GPU reset (or the fault is in one
GPU), per node where it is a reboot, the fabric or a NIC; and a job waiting on unhealthy capacity
says which nodes and GPUs, since when, and who can act (issue 31: "one Xid 79 on GPU 0 of each
node")."""

from __future__ import annotations

import pytest
from django.utils import timezone

from failover.evidence import Finding, FindingKind, HealthReport
from failover.services import health
from failover.services.faults import clear_node
from failover.tests.exits import report_exit
from jobs.fairshare import Capacity, HeldOut, WaitingJob, plan_round
from jobs.models import GPU, JobAttempt, JobExclusion, Node
from jobs.services.placement import place_waiting_jobs, when
from jobs.services.runs import run_started
from jobs.statuses import JobStatus

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_local_agent")]

XID_79 = "GPU has fallen off the bus"
SXID_LINE = "nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Fatal, Link 30 LTSSM Fault Up"


def xid_79_on_gpu_0(node: Node) -> bool:
    report = HealthReport(node=node.name, findings=(Finding(kind=FindingKind.XID, gpu=0, xid=79, detail=XID_79),))
    return health.record_health(node, report, "")


def since(node: str, gpu: int | None = None) -> str:
    """When the GPU (or node) was marked, as a reason shows it."""
    row = GPU.objects.get(node__name=node, index=gpu) if gpu is not None else Node.objects.get(name=node)
    return when(row.unhealthy_since)


def test_one_xid_79_on_gpu_0_of_each_node_leaves_the_other_gpus_placeable(nodes, make_job):
    for node in Node.objects.all():
        assert xid_79_on_gpu_0(node)
    assert not Node.objects.filter(healthy=False).exists()
    assert sorted(GPU.objects.filter(healthy=False).values_list("node__name", "index")) == [("node-a", 0), ("node-b", 0), ("node-c", 0)]
    gpu = GPU.objects.get(node__name="node-b", index=0)
    assert gpu.health_reason == "Xid 79 on GPU 0: GPU has fallen off the bus" and gpu.unhealthy_since is not None

    jobs = [make_job(gpus_per_node=3) for _ in range(3)]
    placed = place_waiting_jobs()
    assert sorted(a.job_id for a in placed) == sorted(j.pk for j in jobs)
    used = sorted((a.placements.get().node.name, tuple(a.placements.get().gpu_indices)) for a in placed)
    assert used == [("node-a", (1, 2, 3)), ("node-b", (1, 2, 3)), ("node-c", (1, 2, 3))]


def test_a_job_waiting_on_unhealthy_gpus_says_which_since_when_and_that_an_operator_must_act(nodes, make_job):
    for node in Node.objects.all():
        xid_79_on_gpu_0(node)
    assert len({since(name, 0) for name in ("node-a", "node-b", "node-c")}) == 1 or pytest.skip("the minute turned while marking")
    job = make_job(gpus_per_node=4)
    assert place_waiting_jobs() == []
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING
    assert job.status_reason == (
        f"1st for 4 GPUs; node-a GPU 0, node-b GPU 0, node-c GPU 0 unhealthy since {since('node-a', 0)} (Xid 79): an operator must mark them healthy"
    )

    clear_node(Node.objects.get(name="node-b"), actor="test")
    assert GPU.objects.get(node__name="node-b", index=0).unhealthy_since is None
    [attempt] = place_waiting_jobs()
    assert (attempt.job_id, attempt.placements.get().node.name) == (job.pk, "node-b")


def test_a_fabric_fault_takes_the_whole_node_out_and_the_reason_names_the_node(nodes, make_job):
    node = Node.objects.get(name="node-c")
    assert health.record_health(node, HealthReport(node="node-c", findings=()), SXID_LINE)
    node.refresh_from_db()
    assert not node.healthy and "SXid 20034" in node.health_reason and node.unhealthy_since is not None
    Node.objects.exclude(name="node-c").update(cordoned=True)
    job = make_job(gpus_per_node=2)
    assert place_waiting_jobs() == []
    job.refresh_from_db()
    assert job.status_reason == f"1st for 2 GPUs; node-c unhealthy since {since('node-c')} (SXid 20034): an operator must mark it healthy"


def test_a_job_that_would_not_fit_even_on_healthy_gpus_does_not_blame_health(nodes, make_job):
    xid_79_on_gpu_0(Node.objects.get(name="node-a"))
    job = make_job(gpus_per_node=4, node_count=3)  # needs all twelve GPUs
    assert place_waiting_jobs() == []
    job.refresh_from_db()
    assert "unhealthy" in job.status_reason  # with node-a's GPU 0 back it would fit: health is why
    Node.objects.filter(name="node-c").update(cordoned=True)  # two nodes left: three would not fit either way
    assert place_waiting_jobs() == []
    job.refresh_from_db()
    assert job.status_reason == "1st for 3 nodes × 4 GPUs; no free capacity fits it"


def test_a_failover_on_xid_79_excludes_the_node_for_the_job_only_and_marks_only_the_gpu(nodes, make_job):
    from failover.models import SimulatedFault

    job = make_job()
    [attempt] = place_waiting_jobs()
    assert run_started(attempt)
    node = attempt.placements.get().node
    SimulatedFault.objects.create(node=node, gpu=0, kind="xid", xid=79, applied_at=timezone.now())
    assert report_exit(JobAttempt.objects.get(pk=attempt.pk), exit_code=None, exit_signal=9) == JobStatus.FAILOVER_IN_PROGRESS
    node.refresh_from_db()
    assert node.healthy and not GPU.objects.get(node=node, index=0).healthy
    assert list(JobExclusion.objects.filter(job=job).values_list("node__name", "gpu")) == [(node.name, None)]
    other = make_job(gpus_per_node=3)
    placed = {a.job_id: a.placements.get() for a in place_waiting_jobs()}
    assert placed[job.pk].node != node
    assert (placed[other.pk].node, placed[other.pk].gpu_indices) == (node, [1, 2, 3])


def test_a_job_failing_over_off_its_node_waits_naming_the_unhealthy_gpus_and_its_exclusion(nodes, make_job):
    from failover.models import SimulatedFault

    job = make_job(gpus_per_node=4)
    [attempt] = place_waiting_jobs()
    assert run_started(attempt)
    assert attempt.placements.get().node.name == "node-a"
    SimulatedFault.objects.create(node=attempt.placements.get().node, gpu=0, kind="xid", xid=79, applied_at=timezone.now())
    assert report_exit(JobAttempt.objects.get(pk=attempt.pk), exit_code=None, exit_signal=9) == JobStatus.FAILOVER_IN_PROGRESS
    for name in ("node-b", "node-c"):
        xid_79_on_gpu_0(Node.objects.get(name=name))
    assert since("node-b", 0) == since("node-c", 0) or pytest.skip("the minute turned while marking")
    assert place_waiting_jobs() == []
    job.refresh_from_db()
    assert job.status == JobStatus.FAILOVER_IN_PROGRESS
    assert job.status_reason == (
        f"1st for 4 GPUs; node-b GPU 0, node-c GPU 0 unhealthy since {since('node-b', 0)} (Xid 79): "
        "an operator must mark them healthy; excluded after faults from node-a"
    )


def test_the_plan_names_unhealthy_capacity_only_when_it_would_let_the_job_fit():
    capacity = Capacity(
        nodes=[(1, "node-a")],
        free={1: [1, 2, 3]},
        held_out=(HeldOut(1, "node-a", (0,), False, "Xid 79", "18:20"), HeldOut(2, "node-b", (0, 1, 2, 3), True, "Xid 167", "18:25")),
        names={1: "node-a", 2: "node-b"},
    )
    plan = plan_round(
        [WaitingJob(1, 1, 4, 1), WaitingJob(2, 1, 4, 1, exclude_nodes=frozenset({2})), WaitingJob(3, 1, 8, 1)],
        {},
        capacity,
        half_life=3600,
    )
    assert plan.reasons[1] == (
        "1st for 4 GPUs; node-a GPU 0 unhealthy since 18:20 (Xid 79); node-b unhealthy since 18:25 (Xid 167): an operator must mark them healthy"
    )
    assert plan.reasons[2] == (
        "2nd for 4 GPUs; node-a GPU 0 unhealthy since 18:20 (Xid 79): an operator must mark it healthy; excluded after faults from node-b"
    )
    assert plan.reasons[3] == "1st for 8 GPUs; no free capacity fits it"


def test_a_reading_keeps_what_a_finding_expected_through_the_event_store(nodes):
    """``expected`` (GPUs visible, a link's width) is stored with the event, so a verdict still says
    "Only 3 of 4 GPUs visible"."""
    node = Node.objects.get(name="node-a")
    since = timezone.now()
    report = HealthReport(
        node=node.name, findings=(Finding(kind=FindingKind.GPU_COUNT, value=3, expected=4, detail="fewer GPUs than expected"),), source="nvml"
    )
    health.record_health(node, report, "")
    [finding] = health.scoped_evidence(node, gpus=[0], since=since).findings
    assert (finding.value, finding.expected) == (3, 4)
    assert "Only 3 of 4 GPUs visible" in health.scoped_evidence(node, gpus=[0], since=since).judge(exit_signal=9).reason
