from __future__ import annotations

import pytest
from django.test import Client

from failover.models import SimulatedFault
from jobs.models import Node

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(staff) -> Client:
    client = Client()
    client.force_login(staff)
    return client


def act(client: Client, action: str, *names: str):
    ids = [str(Node.objects.get(name=n).pk) for n in names]
    return client.post("/admin/jobs/node/", {"action": action, "_selected_action": ids}, follow=True)


def test_operators_inject_a_fault_and_mark_the_node_healthy_from_the_admin(admin_client, nodes):
    response = act(admin_client, "inject_xid79", "node-b")
    assert response.status_code == 200
    assert SimulatedFault.objects.filter(node__name="node-b", gpu=0, kind="xid").exists()
    Node.objects.filter(name="node-b").update(healthy=False)
    act(admin_client, "mark_healthy", "node-b")
    assert Node.objects.get(name="node-b").healthy
    assert not SimulatedFault.objects.filter(cleared_at__isnull=True).exists()


def test_a_fault_cannot_be_injected_into_real_gpus_and_says_why(admin_client, nodes):
    Node.objects.filter(name="node-a").update(simulated=False)
    response = act(admin_client, "inject_ecc", "node-a")
    assert "has real GPUs" in response.content.decode()
    assert not SimulatedFault.objects.exists()


def test_the_fault_and_health_lists_load(admin_client, nodes):
    act(admin_client, "reclaim_spot_capacity", "node-c")
    assert Node.objects.get(name="node-c").spot_reclaimed_until is not None
    for url in ("/admin/failover/simulatedfault/", "/admin/failover/nodehealth/", "/admin/jobs/node/"):
        assert admin_client.get(url).status_code == 200
