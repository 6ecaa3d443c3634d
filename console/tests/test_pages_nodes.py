"""The operators' Nodes page: what it shows, its actions, who may use it, and bad input."""

from __future__ import annotations

import pytest
from django.urls import reverse

from failover.models import SimulatedFault
from jobs.models import GPU, JobExclusion, Node
from jobs.services.placement import place_waiting_jobs

pytestmark = pytest.mark.django_db


def action_url(node: str, action: str) -> str:
    return reverse("nodes:action", args=[node, action])


def test_staff_see_nodes_gpus_health_and_running_jobs(login, staff, nodes, make_job):
    job = make_job(name="resnet", gpus_per_node=2)
    place_waiting_jobs()
    GPU.objects.filter(node__name="node-c", index=3).update(healthy=False, health_reason="Xid 79: GPU has fallen off the bus")
    Node.objects.filter(name="node-c").update(healthy=False, health_reason="GPU 3 fell off the bus")
    html = login(staff).get(reverse("nodes:list")).content.decode()
    for node in nodes:
        assert f'data-node="{node.name}"' in html
    assert "resnet" in html and reverse("jobs:detail", args=[job.pk]) in html
    assert "GPU 3 fell off the bus" in html and "Xid 79: GPU has fallen off the bus" in html
    assert 'aria-current="page">Nodes</a>' in html
    assert html.count('name="csrfmiddlewaretoken"') >= 3 * len(nodes)


def test_a_healthy_node_with_an_unhealthy_gpu_says_so_and_offers_mark_healthy(login, staff, nodes):
    # Health is per GPU where the fault is (an Xid 79): the node stays placeable, its header says
    # how many of its GPUs are out, and the operator can mark them healthy.
    GPU.objects.filter(node__name="node-b", index=0).update(healthy=False, health_reason="Xid 79: GPU has fallen off the bus")
    html = login(staff).get(reverse("nodes:list")).content.decode()
    section = html.split('data-node="node-b"', 1)[1].split('data-node="', 1)[0]
    assert '<span class="badge__text">1 GPU unhealthy</span>' in section and ">Healthy<" not in section
    assert 'data-action="clear"' in section and "Mark healthy" in section
    other = html.split('data-node="node-a"', 1)[1].split('data-node="', 1)[0]
    assert ">Healthy<" in other and 'data-action="clear"' not in other


def test_a_healthy_node_that_jobs_are_kept_off_offers_mark_healthy_which_lifts_it(login, staff, nodes, make_job):
    # After its fault cleared by itself, a node is healthy again, but the jobs that failed over
    # from it stay excluded until an operator marks it healthy.
    job = make_job(name="failed-over")
    node = Node.objects.get(name="node-a")
    JobExclusion.objects.create(job=job, node=node)
    client = login(staff)
    section = client.get(reverse("nodes:list")).content.decode().split('data-node="node-a"', 1)[1].split('data-node="', 1)[0]
    assert ">Healthy<" in section and 'data-action="clear"' in section and "1 job kept off it after a fault" in section
    assert "The jobs using the chosen GPU (for the whole node: every job on it) stop and fail over." in section
    client.post(action_url("node-a", "clear"))
    assert not JobExclusion.objects.filter(node=node).exists()
    section = client.get(reverse("nodes:list")).content.decode().split('data-node="node-a"', 1)[1].split('data-node="', 1)[0]
    assert 'data-action="clear"' not in section


@pytest.mark.parametrize("who", ["owner", "outsider"])
def test_users_who_are_not_staff_may_not_open_it_or_act(request, login, nodes, who):
    client = login(request.getfixturevalue(who))
    assert client.get(reverse("nodes:list")).status_code == 403
    assert client.post(action_url("node-a", "cordon")).status_code == 403
    assert not Node.objects.filter(cordoned=True).exists()
    assert "Nodes</a>" not in client.get(reverse("jobs:list")).content.decode()


def test_anonymous_visitors_are_sent_to_log_in(client, nodes):
    response = client.get(reverse("nodes:list"))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


def test_cordon_and_uncordon(login, staff, nodes):
    client = login(staff)
    response = client.post(action_url("node-a", "cordon"), follow=True)
    assert "node-a cordoned" in response.content.decode()
    assert Node.objects.get(name="node-a").cordoned
    client.post(action_url("node-a", "uncordon"))
    assert not Node.objects.get(name="node-a").cordoned


def test_inject_a_fault_into_a_simulated_gpu_and_clear_it(login, staff, nodes):
    client = login(staff)
    response = client.post(action_url("node-b", "inject"), {"kind": "xid", "gpu": "2", "xid": "79"}, follow=True)
    assert "Injected: Xid error on node-b/gpu2" in response.content.decode()
    fault = SimulatedFault.objects.get()
    assert (fault.node.name, fault.gpu, fault.kind, fault.xid, fault.created_by) == ("node-b", 2, "xid", 79, "operator")
    client.post(action_url("node-b", "clear"))
    assert SimulatedFault.objects.get().cleared_at is not None


def test_a_whole_node_fault_ignores_an_xid_for_other_kinds(login, staff, nodes):
    login(staff).post(action_url("node-a", "inject"), {"kind": "ecc", "gpu": "", "xid": "79"})
    fault = SimulatedFault.objects.get()
    assert (fault.gpu, fault.kind, fault.xid) == (None, "ecc", None)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"kind": "meteor", "gpu": "0"}, "Fault: Select a valid choice."),
        ({"kind": "xid", "gpu": "9"}, "node-a has no GPU 9."),
        ({"kind": "xid", "gpu": "abc"}, "GPU: Enter a whole number."),
        ({"kind": "xid", "gpu": "0", "xid": "5000"}, "Xid: Ensure this value is less than or equal to 1000."),
        ({}, "Fault: This field is required."),
    ],
)
def test_bad_fault_requests_come_back_as_messages(login, staff, nodes, payload, message):
    response = login(staff).post(action_url("node-a", "inject"), payload, follow=True)
    assert response.status_code == 200
    assert message in response.content.decode()
    assert not SimulatedFault.objects.exists()


def test_faults_go_only_into_simulated_nodes(login, staff, nodes):
    Node.objects.filter(name="node-a").update(simulated=False)
    response = login(staff).post(action_url("node-a", "inject"), {"kind": "xid", "gpu": "0"}, follow=True)
    assert "faults can only be injected into simulated ones" in response.content.decode()


def test_reclaim_spot_capacity(login, staff, nodes):
    response = login(staff).post(action_url("node-a", "reclaim"), follow=True)
    assert "Spot capacity on node-a reclaimed: 0 Spot jobs stopping." in response.content.decode()
    assert Node.objects.get(name="node-a").spot_reclaimed_until is not None


def test_unknown_nodes_and_actions_are_404_and_get_is_refused(login, staff, nodes):
    client = login(staff)
    assert client.post(action_url("node-zz", "cordon")).status_code == 404
    assert client.post(action_url("node-a", "explode")).status_code == 404
    assert client.get(action_url("node-a", "cordon")).status_code == 405


def test_actions_need_the_csrf_token(staff, nodes):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(staff)
    assert client.post(action_url("node-a", "cordon")).status_code == 403
    assert not Node.objects.get(name="node-a").cordoned


def test_the_nodes_page_says_loudly_when_jobs_run_unsandboxed(login, staff, nodes, settings):
    settings.JOB_SANDBOX = "off"
    html = login(staff).get(reverse("nodes:list")).content.decode()
    assert 'data-field="sandbox"' in html and "run with the console's own privileges" in html


def test_the_latest_health_events_and_an_unreadable_kernel_log_are_shown(login, staff, nodes, django_assert_max_num_queries):
    from failover.models import HealthEvent, NodeHealth

    node = Node.objects.get(name="node-b")
    for n in range(7):
        HealthEvent.objects.create(node=node, kind="xid", gpu=1, xid=13, source="nvml", message=f"event {n}")
    HealthEvent.objects.create(node=node, kind="gpu_lost", gpu=2, source="nvml", message="NVML: GPU is lost", fatal=True)
    HealthEvent.objects.create(node=node, kind="network_link_down", nic="mlx5_0", source="kmsg", message="mlx5_core 0000:5e:00.0 mlx5_0: Link down")
    NodeHealth.objects.create(node=node, kernel_log_note="kernel log unreadable (/dev/kmsg: Permission denied)")
    client = login(staff)
    with django_assert_max_num_queries(12):
        html = client.get(reverse("nodes:list")).content.decode()
    section = html[html.index('data-node="node-b"') : html.index('data-node="node-c"')]
    assert "GPU 2: gpu_lost (runs stopped)" in section and "mlx5_0: network_link_down" in section
    assert "event 6" in section and "event 4" in section and "event 3" not in section  # the latest five
    assert "kernel log unreadable (/dev/kmsg: Permission denied)" in section
    assert "Health events" not in html[html.index('data-node="node-a"') : html.index('data-node="node-b"')]
