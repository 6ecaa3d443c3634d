"""The list reads each access branch (own jobs, each project's, per status when filtered) off its
own index (``console.paging``): a user still sees exactly their own and their projects' jobs,
every one once, in the order asked for, on every page, on the page and in the API."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone

from harness.api import JOBS_URL
from jobs.models import Project, TrainingJob
from jobs.services.creation import personal_project_for
from jobs.statuses import ACTIVE, JobStatus

pytestmark = pytest.mark.django_db

STATUSES = [JobStatus.PENDING, JobStatus.RUNNING, JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.STOPPED]


@pytest.fixture
def shared_world(owner, teammate, outsider, default_image):
    """teammate sees: their own jobs (one in a project they have left), owner's jobs in owner's
    personal project (teammate is a member), and a second shared project's jobs. Not: owner's
    jobs in a project teammate is not in, nor outsider's. Dates interleave the branches, and
    several jobs share one created_at (the id breaks the tie)."""
    left = Project.objects.create(name="left-behind")  # teammate's jobs stay theirs after leaving
    shared = Project.objects.create(name="shared")
    shared.members.add(teammate, outsider)
    private = Project.objects.create(name="owner-only")
    private.members.add(owner)
    places = [
        (teammate, personal_project_for(teammate), True),
        (owner, personal_project_for(owner), True),
        (outsider, shared, True),
        (teammate, left, True),
        (owner, private, False),
        (outsider, personal_project_for(outsider), False),
    ]
    now = timezone.now()
    rows = []
    for i in range(66):
        user, project, _visible = places[i % len(places)]
        rows.append(
            TrainingJob(
                name=f"j{i:03d}",
                owner=user,
                project=project,
                image=default_image.reference,
                command="python train.py",
                status=STATUSES[i % len(STATUSES)],
                created_at=now - timedelta(minutes=i // 3),  # three jobs per minute
            )
        )
    TrainingJob.objects.bulk_create(rows)
    visible = [row.name for i, row in enumerate(rows) if places[i % len(places)][2]]
    return TrainingJob.objects.filter(name__in=visible)


def page_names(client, **params) -> list[str]:
    html = client.get(reverse("jobs:list"), params).content.decode()
    return re.findall(r'<a class="strong" href="/training-jobs/\d+/">([^<]+)</a>', html)


def expected(jobs, order: tuple[str, ...], statuses=None) -> list[str]:
    if statuses:
        jobs = jobs.filter(status__in=statuses)
    return list(jobs.order_by(*order).values_list("name", flat=True))


@pytest.mark.parametrize("sort,order", [("-created", ("-created_at", "-id")), ("created", ("created_at", "id")), ("name", ("name", "id"))])
def test_every_page_of_the_list_holds_the_visible_jobs_in_order(login, teammate, shared_world, sort, order):
    client = login(teammate)
    want = expected(shared_world, order)
    assert len(want) == 44
    seen = [name for page in (1, 2, 3) for name in page_names(client, sort=sort, page_size=20, page=page)]
    assert seen == want


@pytest.mark.parametrize("status,statuses", [("group:active", ACTIVE), (JobStatus.COMPLETED, [JobStatus.COMPLETED])])
def test_a_status_filtered_list_holds_the_visible_jobs_of_that_status(login, teammate, shared_world, status, statuses):
    client = login(teammate)
    want = expected(shared_world, ("-created_at", "-id"), statuses)
    pages = range(1, (len(want) + 19) // 20 + 1)  # past the last page the list shows the last one again
    seen = [name for page in pages for name in page_names(client, status=status, page_size=20, page=page)]
    assert seen == want and want
    html = client.get(reverse("jobs:list"), {"status": status}).content.decode()
    assert f"{len(want)} jobs" in html


@pytest.mark.parametrize("sort,order", [("name", ("name", "id")), ("-created", ("-created_at", "-id"))])
def test_a_status_group_with_a_search_and_a_sort_holds_the_visible_jobs_that_match(login, teammate, shared_world, sort, order):
    """Several statuses: each access part's subquery compiled once, its status a parameter
    (``console.paging.branches_sql``); the search's own parameter stays where it was."""
    client = login(teammate)
    want = expected(shared_world.filter(name__contains="1"), order, ACTIVE)
    assert len(want) > 1
    assert page_names(client, status="group:active", q="1", sort=sort, page_size=20) == want


def test_several_statuses_compile_one_subquery_per_access_part(teammate, shared_world):
    from console.paging import branches_sql, list_branches

    branches = list_branches(teammate, ACTIVE)
    parts, statuses = branches.product
    jobs = TrainingJob.objects.visible_to(teammate).filter(status__in=ACTIVE, name__contains="1").order_by("-created_at", "-id")
    sql, params = branches_sql(jobs, parts, statuses, ("-created_at", "-id"), 20)
    assert sql.count("UNION ALL") == len(parts) * len(statuses) - 1 and len(branches.rows) == len(parts) * len(statuses)
    assert sorted(p for p in params if p in ACTIVE) == sorted(list(statuses) * len(parts) + list(ACTIVE) * len(parts) * len(statuses))


def test_the_api_pages_hold_the_visible_jobs_in_order(api_as, teammate, shared_world):
    client = api_as(teammate)
    want = expected(shared_world, ("-created_at", "-id"))
    seen, count = [], None
    for offset in range(0, 50, 15):
        body = client.get(JOBS_URL, {"limit": 15, "offset": offset}).json()
        count = body["count"]
        seen += [job["name"] for job in body["results"]]
    assert seen == want and count == len(want)


def test_the_api_status_filter_counts_and_lists_the_visible_jobs(api_as, teammate, shared_world):
    client = api_as(teammate)
    want = expected(shared_world, ("name", "id"), [JobStatus.RUNNING, JobStatus.PENDING])
    body = client.get(JOBS_URL, {"status": "Running,Pending", "ordering": "name", "limit": 100}).json()
    assert [job["name"] for job in body["results"]] == want and body["count"] == len(want)


def test_staff_see_every_job_in_order_filtered_or_not(login, staff, shared_world):
    client = login(staff)
    every = TrainingJob.objects.all()
    assert page_names(client, page_size=50) == expected(every, ("-created_at", "-id"))[:50]
    want = expected(every, ("-created_at", "-id"), ACTIVE)
    assert page_names(client, status="group:active", page_size=50) == want


def test_a_user_in_no_project_sees_only_their_own(login, default_image):
    loner = User.objects.create_user("loner", password="loner-pass-1")
    project = Project.objects.create(name="not-theirs")
    TrainingJob.objects.create(name="mine", owner=loner, project=project, image=default_image.reference, command="x")
    assert page_names(login(loner)) == ["mine"]
