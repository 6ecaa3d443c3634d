"""GPU nodes through the API: staff see them and cordon them; nobody else may."""

from __future__ import annotations

import pytest

from harness.api import NODES_URL
from jobs.models import GPU, AttemptNode, JobAttempt, Node

pytestmark = pytest.mark.django_db


@pytest.fixture
def node(db) -> Node:
    node = Node.objects.create(name="node-a", gpu_model="H100", simulated=True)
    for index in range(2):
        GPU.objects.create(node=node, index=index, model="H100", memory_mb=81559)
    return node


def test_staff_list_the_nodes_with_their_gpus(api_as, staff, node, job):
    attempt = JobAttempt.objects.create(job=job, number=1)
    held = AttemptNode.objects.create(attempt=attempt, node=node, gpu_indices=[1])
    GPU.objects.filter(node=node, index=1).update(allocated_to=held)

    body = api_as(staff).get(NODES_URL).json()

    assert body["count"] == 1
    listed = body["results"][0]
    assert {k: listed[k] for k in ("name", "gpu_model", "state", "healthy", "cordoned", "simulated")} == {
        "name": "node-a",
        "gpu_model": "H100",
        "state": "Ready",
        "healthy": True,
        "cordoned": False,
        "simulated": True,
    }
    assert [(g["index"], g["memory_mb"], g["allocated"]) for g in listed["gpus"]] == [(0, 81559, False), (1, 81559, True)]


@pytest.mark.parametrize("key", ["node-a", "id"])
def test_staff_see_one_node_by_name_or_id(api_as, staff, node, key):
    key = str(node.pk) if key == "id" else key

    response = api_as(staff).get(f"{NODES_URL}{key}/")

    assert response.status_code == 200
    assert response.json()["name"] == "node-a"


@pytest.mark.parametrize("key", ["node-z", "999", "Node_A", "%00", "99999999999999999999999"])
def test_an_unknown_node_is_a_404(api_as, staff, node, key):
    assert api_as(staff).get(f"{NODES_URL}{key}/").status_code == 404


def test_staff_cordon_and_uncordon_a_node(api_as, staff, node):
    api = api_as(staff)

    response = api.post(f"{NODES_URL}node-a/cordon/")
    assert response.status_code == 200 and response.json()["cordoned"] is True
    node.refresh_from_db()
    assert node.cordoned and not node.schedulable

    response = api.post(f"{NODES_URL}{node.pk}/uncordon/")
    assert response.status_code == 200 and response.json()["cordoned"] is False
    node.refresh_from_db()
    assert not node.cordoned


@pytest.mark.parametrize("who", ["owner", "teammate", "outsider"])
@pytest.mark.parametrize(("method", "path"), [("get", ""), ("get", "node-a/"), ("post", "node-a/cordon/"), ("post", "node-a/uncordon/")])
def test_users_who_are_not_staff_get_403(api_as, owner, teammate, outsider, node, who, method, path):
    user = {"owner": owner, "teammate": teammate, "outsider": outsider}[who]

    response = getattr(api_as(user), method)(f"{NODES_URL}{path}")

    assert response.status_code == 403
    node.refresh_from_db()
    assert not node.cordoned


def test_the_node_list_takes_a_fixed_number_of_queries(api_as, staff, node, django_assert_max_num_queries):
    for n in range(5):
        extra = Node.objects.create(name=f"node-{n}")
        GPU.objects.create(node=extra, index=0)

    with django_assert_max_num_queries(3):
        assert api_as(staff).get(NODES_URL).json()["count"] == 6
