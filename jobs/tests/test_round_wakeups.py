"""What wakes the embedded control round (``jobs.services.wakeups``) and the timed work a round
returns: the services that change its answer raise a loop's flag after commit, a process with no
loop writes the wake file instead, and a round names its next retry time or stale heartbeat."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from failover.services import faults, policy
from jobs.models import Node, TrainingJob
from jobs.services import wakeups
from jobs.services.actions import delete_job, request_stop
from jobs.services.control import control_round
from jobs.services.lifecycle import record_placements, record_reason, transition
from jobs.statuses import JobStatus

pytestmark = pytest.mark.django_db


@pytest.fixture
def wake_file(settings, tmp_path):
    settings.CONTROL_WAKEUPS = True
    settings.CONTROL_WAKE_FILE = tmp_path / "control-wanted"
    return settings.CONTROL_WAKE_FILE


@pytest.fixture
def loop_flag(wake_file):
    """A control loop of this process, as ``agent.loop`` subscribes one."""
    woken = []
    subscription = wakeups.subscribe(lambda: woken.append(1))
    yield subscription
    wakeups.unsubscribe(subscription)


def test_a_created_job_wakes_the_round_after_commit(loop_flag, make_job, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        make_job()
        assert not loop_flag.pending(), "woken before the job was committed"
    for callback in callbacks:
        callback()
    assert loop_flag.take() and not loop_flag.pending()


def test_status_changes_wake_it_and_placements_own_records_do_not(loop_flag, make_job, django_capture_on_commit_callbacks):
    job = make_job()
    loop_flag.take()
    with django_capture_on_commit_callbacks(execute=True):
        record_placements({job.pk: (JobStatus.PENDING, "placed on node-a GPU 0; starting", 1)})
        record_reason(job.pk, reason="placed on node-a GPU 0; starting", expected={JobStatus.PENDING}, actor="placement")
    assert not loop_flag.pending()

    with django_capture_on_commit_callbacks(execute=True):
        transition(job.pk, JobStatus.IMAGE_PULL_BACKOFF, reason="pull failed; retry 1 in 10s", next_retry_at=timezone.now())
    assert loop_flag.take()


def test_a_stop_and_a_delete_wake_it(loop_flag, make_job, django_capture_on_commit_callbacks):
    job = make_job()
    loop_flag.take()
    with django_capture_on_commit_callbacks(execute=True):
        request_stop(job, actor="owner")
    assert loop_flag.take()
    with django_capture_on_commit_callbacks(execute=True):
        delete_job(TrainingJob.objects.get(pk=job.pk))
    assert loop_flag.take()


def test_a_cleared_node_and_a_spot_reclaim_wake_it(loop_flag, nodes, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        faults.clear_node(nodes[0])
    assert loop_flag.take()
    with django_capture_on_commit_callbacks(execute=True):
        faults.reclaim_spot(nodes[1])
    assert loop_flag.take()


def test_a_process_with_no_loop_writes_the_wake_file_and_its_own_watch_ignores_it(wake_file, make_job, django_capture_on_commit_callbacks):
    watch = wakeups.FileWatch(every=0)
    with django_capture_on_commit_callbacks(execute=True):
        make_job()
    assert wake_file.read_bytes() == b"."
    assert not watch.changed(), "a process's own write woke its own loop"

    with open(wake_file, "ab") as other_process:
        other_process.write(b".")
    assert watch.changed()
    assert not watch.changed()


def test_the_wake_file_starts_afresh_when_it_has_grown(wake_file):
    wake_file.write_bytes(b"." * wakeups.WAKE_FILE_MAX_BYTES)
    wakeups.signal_other_processes()
    assert wake_file.read_bytes() == b"."


def test_scale_out_writes_no_wake_file_and_its_rounds_name_no_timed_work(wake_file, settings, make_job, django_capture_on_commit_callbacks, monkeypatch):
    settings.SCALE_OUT = True
    monkeypatch.setattr(policy, "_last_outage", None)  # no Redis here: the sweep notes an outage
    with django_capture_on_commit_callbacks(execute=True):
        make_job()
    assert not wake_file.exists()
    assert control_round().next_due is None


def test_a_round_names_the_next_retry_time_of_an_image_pull(wake_file, make_job):
    job = make_job()
    retry = timezone.now() + timedelta(seconds=42)
    transition(job.pk, JobStatus.IMAGE_PULL_BACKOFF, reason="pull failed; retry 1 in 42s", next_retry_at=retry)

    assert control_round().next_due == pytest.approx(retry.timestamp(), abs=0.01)


def test_a_round_names_when_a_node_served_elsewhere_goes_stale(wake_file, nodes, settings):
    settings.NODE_HEARTBEAT_TIMEOUT = 90.0
    beat = timezone.now() - timedelta(seconds=30)
    Node.objects.update(last_heartbeat=timezone.now())
    Node.objects.filter(pk=nodes[1].pk).update(last_heartbeat=beat)

    assert policy.next_timed_work() == pytest.approx(beat.timestamp() + 90.0, abs=0.01)
    assert control_round().next_due == pytest.approx(beat.timestamp() + 90.0, abs=0.01)


def test_nodes_this_process_serves_and_lost_ones_are_no_timed_work(wake_file, nodes, agent):
    Node.objects.filter(pk=nodes[0].pk).update(state=Node.State.NOT_READY)

    assert policy.next_timed_work() is None  # node-a is lost already; the agent beats for the others
