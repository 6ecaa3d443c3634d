"""The service guide's Spot script, as a user submits it, in its container on the default image:
``PYTHONPATH=$CHECKPOINT_VENDOR`` imports ckptlib's ``datastates``, an Xid 79 on its GPU fails it
over to another node, and the second attempt resumes from the checkpoint the first committed in
the script's own ``./results`` (the run's work directory, not ``$OUTPUT_DIR``)."""

from __future__ import annotations

import pytest

import ckptlib
from failover.services.faults import inject_fault
from harness.job_factory import job_output
from harness.node_agent import pump_until
from harness.sandbox import needs_sandbox
from jobs.models import JobAttempt
from jobs.statuses import JobStatus

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, needs_sandbox]

MAX_STEPS = 240
ENV = {
    "SPOT_ASSETS_DIR": "/job/work/assets",
    # Long enough that the fault lands mid-run: 30 steps were sometimes all done before the
    # agent's next round saw the first commit. The script trains ~28 steps/s on an idle 2-core
    # machine (8 micro-batches a step), so 240 leave it ~8 s after its first commit, against
    # the ~0.3 s the test takes to see the commit and inject the fault; each step costs a CI run
    # ~40 ms of CPU on both attempts (600 steps: ~20 s of a test's 45).
    "SPOT_MAX_STEPS": str(MAX_STEPS),
    "SPOT_SAVE_STEPS": "6",
    "SPOT_MAX_LENGTH": "32",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HOME": "/job/work/hf-home",
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def commits(job, attempt: int) -> list[int]:
    return [e.step for line in job_output(job, attempt=attempt) if (e := ckptlib.parse_commit_line(line))]


def fault_after_first_commit(make_job, drive, agent):
    """The guide's Spot script run until it has committed a checkpoint, then an Xid 79 on its
    GPU, then driven to its end: the job, and its first attempt's rank (on the agents and on
    Slurm alike)."""
    job = make_job(command="PYTHONPATH=$CHECKPOINT_VENDOR python /opt/examples/spot_train.py", env=ENV, gpus_per_node=1)
    job = drive(job, JobStatus.RUNNING, timeout=120)
    pump_until(agent, lambda: commits(job, 1), "a first commit", timeout=300, describe=lambda: "\n".join(job_output(job)[-20:]))
    part = JobAttempt.objects.get(job=job, number=1).placements.select_related("node").get()
    inject_fault(part.node, gpu=part.gpu_indices[0], xid=79, actor="test")
    return drive(job, {JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.INTERNAL_ERROR}, timeout=600), part


def test_the_spot_script_fails_over_on_xid_79_and_resumes_from_its_checkpoint(make_job, drive, agent):
    job, part = fault_after_first_commit(make_job, drive, agent)
    first = part.attempt
    assert job.status == JobStatus.COMPLETED, (job.status_reason, job_output(job)[-30:])
    assert job.failover_count == 1
    second = JobAttempt.objects.get(job=job, number=2)
    assert second.placements.get().node != part.node
    assert second.image_digest == first.image_digest
    assert second.resume_step is not None and second.resume_step >= 6 and second.resume_step % 6 == 0
    resumed = [line for line in job_output(job, attempt=2) if "resuming from" in line]
    assert resumed and resumed[0].endswith(f"/job/work/results/concurrent_checkpoint/checkpoint-{second.resume_step}"), resumed
    assert commits(job, 2)[0] > second.resume_step
    assert commits(job, 2)[-1] == MAX_STEPS
