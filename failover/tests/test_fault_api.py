from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from failover.models import SimulatedFault
from jobs.models import Node

pytestmark = pytest.mark.django_db


@pytest.fixture
def api():
    return APIClient()


def test_staff_inject_a_fault_and_clear_the_node(api, staff, nodes):
    api.force_authenticate(staff)
    response = api.post("/api/v1/nodes/node-b/inject-fault/", {"gpu": 1, "kind": "xid", "xid": 79}, format="json")
    assert response.status_code == 201
    assert response.json()["node"] == "node-b" and response.json()["xid"] == 79
    assert SimulatedFault.objects.filter(node__name="node-b", gpu=1, xid=79).exists()
    Node.objects.filter(name="node-b").update(healthy=False)
    assert api.post("/api/v1/nodes/node-b/clear/").status_code == 200
    assert Node.objects.get(name="node-b").healthy
    assert not SimulatedFault.objects.filter(node__name="node-b", cleared_at__isnull=True).exists()


@pytest.mark.parametrize(
    "payload, message",
    [
        ({"gpu": 9}, "has no GPU 9"),
        ({"kind": "ecc", "xid": 79}, "Xid number goes with the xid kind only"),
        ({"kind": "melted"}, "is not a valid choice"),
        ({"xid": 0}, "greater than or equal to 1"),
        ({"gpu": "one"}, "A valid integer is required"),
    ],
)
def test_bad_fault_requests_get_a_clear_400(api, staff, nodes, payload, message):
    api.force_authenticate(staff)
    response = api.post("/api/v1/nodes/node-a/inject-fault/", payload, format="json")
    assert response.status_code == 400
    assert message in str(response.json())


def test_an_unknown_node_is_404(api, staff, nodes):
    api.force_authenticate(staff)
    assert api.post("/api/v1/nodes/nope/inject-fault/", {}, format="json").status_code == 404


def test_users_who_are_not_staff_may_not_inject_faults(api, owner, nodes):
    api.force_authenticate(owner)
    assert api.post("/api/v1/nodes/node-a/inject-fault/", {}, format="json").status_code == 403
    assert api.post("/api/v1/nodes/node-a/reclaim-spot/").status_code == 403
    api.force_authenticate(None)
    assert api.post("/api/v1/nodes/node-a/clear/").status_code in (401, 403)
    assert not SimulatedFault.objects.exists()
