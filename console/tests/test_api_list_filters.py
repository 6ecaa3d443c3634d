"""Listing jobs: filters by status, type and name, ordering, paging, and a fixed query count."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from harness.api import JOBS_URL, move_to
from jobs.statuses import JobStatus

pytestmark = pytest.mark.django_db


@pytest.fixture
def jobs(make_job):
    """Four jobs, created in this order: alpha (Running), beta (Completed, Spot), gamma, alpha-two."""
    alpha = move_to(make_job(name="alpha"), JobStatus.RUNNING)
    beta = move_to(make_job(name="beta", job_type="Spot"), JobStatus.COMPLETED)
    gamma = make_job(name="gamma")
    alpha_two = make_job(name="alpha-two", job_type="Spot")
    return {"alpha": alpha, "beta": beta, "gamma": gamma, "alpha-two": alpha_two}


def names(api, query: str = "") -> list[str]:
    response = api.get(JOBS_URL + query)
    assert response.status_code == 200, response.json()
    return [job["name"] for job in response.json()["results"]]


def test_the_newest_job_comes_first_by_default(owner_api, jobs):
    assert names(owner_api) == ["alpha-two", "gamma", "beta", "alpha"]


def test_status_filters_by_the_exact_text(owner_api, jobs):
    assert names(owner_api, "?status=Running") == ["alpha"]
    assert names(owner_api, "?status=Pending") == ["alpha-two", "gamma"]


def test_status_may_repeat_or_be_comma_separated(owner_api, jobs):
    assert names(owner_api, "?status=Running&status=Completed") == ["beta", "alpha"]
    assert names(owner_api, "?status=Running,Completed") == ["beta", "alpha"]


def test_a_status_with_spaces_is_matched_exactly(owner_api, jobs):
    move_to(jobs["gamma"], JobStatus.IMAGE_PULL_BACKOFF)

    response = owner_api.get(JOBS_URL, {"status": "Pending - imagepullbackoff"})

    assert [job["name"] for job in response.json()["results"]] == ["gamma"]
    assert response.json()["results"][0]["status"] == "Pending - imagepullbackoff"


def test_job_type_filters(owner_api, jobs):
    assert names(owner_api, "?job_type=Spot") == ["alpha-two", "beta"]


def test_search_finds_a_part_of_the_name_in_any_case(owner_api, jobs):
    assert names(owner_api, "?search=ALPHA") == ["alpha-two", "alpha"]
    assert names(owner_api, "?search=zzz") == []


@pytest.mark.parametrize(
    ("ordering", "expected"),
    [
        ("name", ["alpha", "alpha-two", "beta", "gamma"]),
        ("-name", ["gamma", "beta", "alpha-two", "alpha"]),
        ("created_at", ["alpha", "beta", "gamma", "alpha-two"]),
        ("-created_at", ["alpha-two", "gamma", "beta", "alpha"]),
        ("status", ["beta", "alpha-two", "gamma", "alpha"]),
    ],
)
def test_ordering(owner_api, jobs, ordering, expected):
    assert names(owner_api, f"?ordering={ordering}") == expected


def test_filters_combine(owner_api, jobs):
    assert names(owner_api, "?search=alpha&job_type=Spot&status=Pending") == ["alpha-two"]


def test_limit_and_offset_page_the_list(owner_api, jobs):
    body = owner_api.get(JOBS_URL + "?limit=2&offset=1").json()

    assert body["count"] == 4
    assert [job["name"] for job in body["results"]] == ["gamma", "beta"]
    assert body["next"] and body["previous"]


def test_unknown_parameters_are_ignored(owner_api, jobs):
    assert len(names(owner_api, "?colour=blue&page=3")) == 4


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("?status=Bogus", "status"),
        ("?status=running", "status"),
        ("?status=Running,Nope", "status"),
        ("?job_type=Reserved", "job_type"),
        ("?ordering=owner", "ordering"),
        ("?ordering=-id", "ordering"),
        ("?search=" + "x" * 201, "search"),
        ("?search=%00", "search"),
    ],
)
def test_an_invalid_filter_is_a_400_naming_it(owner_api, jobs, query, field):
    response = owner_api.get(JOBS_URL + query)

    assert response.status_code == 400
    assert field in response.json()


@pytest.mark.parametrize("query", ["?limit=99999999999999999999999", "?offset=99999999999999999999999", "?limit=-1&offset=x"])
def test_huge_or_odd_paging_numbers_are_not_an_error(owner_api, jobs, query):
    assert owner_api.get(JOBS_URL + query).status_code == 200


@pytest.mark.parametrize("user", ["owner", "teammate", "staff"])
def test_the_list_runs_the_same_queries_for_any_page_size(api_as, make_job, project, owner, teammate, staff, user):
    for n in range(60):
        make_job(name=f"job-{n}", owner=owner if n % 2 else teammate, project=project)
    api = api_as({"owner": owner, "teammate": teammate, "staff": staff}[user])

    counts = []
    for limit in (5, 50):
        with CaptureQueriesContext(connection) as queries:
            assert len(api.get(f"{JOBS_URL}?limit={limit}").json()["results"]) == limit
        counts.append(len(queries))

    # The page's rows and counts; then, the page holding waiting jobs, their start estimates
    # read the GPUs once for the page (who holds them, and each node's free ones).
    assert counts[0] == counts[1] <= 3 + 2
