"""Who may open which page: owner, teammate, staff see a job; an outsider gets 404; anonymous users log in."""

from __future__ import annotations

import pytest
from django.urls import reverse

from harness.pages import listed_job_ids, put_in_status
from jobs.models import TrainingJob
from jobs.statuses import JobStatus

pytestmark = pytest.mark.django_db

JOB_PAGES = [("jobs:detail", "get"), ("jobs:clone", "get"), ("jobs:delete", "get")]
JOB_ACTIONS = [("jobs:stop", "post"), ("jobs:delete", "post"), ("jobs:clone", "post")]


@pytest.mark.parametrize(
    "url",
    [
        reverse("jobs:list"),
        reverse("jobs:create"),
        reverse("jobs:detail", args=[1]),
        reverse("jobs:detail", args=[1]) + "?tab=logs",
        reverse("jobs:clone", args=[1]),
        reverse("jobs:delete", args=[1]),
    ],
)
def test_anonymous_users_are_sent_to_the_login_page(client, url):
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login") + "?next=")


@pytest.mark.parametrize("name", ["jobs:stop", "jobs:delete", "jobs:clone"])
def test_anonymous_users_cannot_act_on_a_job(client, make_job, name):
    job = make_job()
    response = client.post(reverse(name, args=[job.pk]))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING
    assert TrainingJob.objects.count() == 1


def test_anonymous_bulk_actions_are_sent_to_login(client, make_job):
    job = make_job()
    response = client.post(reverse("jobs:bulk"), {"action": "stop", "job_ids": [job.pk]})
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING


@pytest.mark.parametrize("who", ["owner", "teammate", "staff"])
@pytest.mark.parametrize("name", ["jobs:detail", "jobs:clone", "jobs:delete"])
def test_owner_teammate_and_staff_open_every_page_of_a_job(request, login, make_job, who, name):
    job = make_job()
    client = login(request.getfixturevalue(who))
    response = client.get(reverse(name, args=[job.pk]))
    assert response.status_code == 200
    assert job.name in response.content.decode()


@pytest.mark.parametrize("tab", ["details", "logs", "events"])
@pytest.mark.parametrize("who", ["owner", "teammate", "staff"])
def test_every_tab_of_the_detail_page_opens_for_those_who_may_see_the_job(request, login, make_job, who, tab):
    job = make_job()
    response = login(request.getfixturevalue(who)).get(reverse("jobs:detail", args=[job.pk]), {"tab": tab})
    assert response.status_code == 200


@pytest.mark.parametrize("who", ["owner", "teammate", "outsider", "staff"])
@pytest.mark.parametrize("name", ["jobs:list", "jobs:create"])
def test_every_signed_in_user_opens_the_list_and_the_create_form(request, login, who, name):
    response = login(request.getfixturevalue(who)).get(reverse(name))
    assert response.status_code == 200


@pytest.mark.parametrize("name,method", JOB_PAGES + JOB_ACTIONS)
def test_an_outsider_gets_not_found_for_another_users_job(login, outsider, make_job, name, method):
    job = put_in_status(make_job(), JobStatus.COMPLETED)
    client = login(outsider)
    response = getattr(client, method)(reverse(name, args=[job.pk]))
    assert response.status_code == 404
    assert "Not found" in response.content.decode()
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED
    assert TrainingJob.objects.count() == 1


def test_an_outsider_cannot_stop_a_running_job_of_another_user(login, outsider, make_job):
    job = put_in_status(make_job(), JobStatus.RUNNING)
    response = login(outsider).post(reverse("jobs:stop", args=[job.pk]))
    assert response.status_code == 404
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING


def test_the_list_shows_each_user_only_the_jobs_they_may_see(login, owner, teammate, outsider, staff, make_job):
    owners = make_job(name="owners-job")
    teammates = make_job(name="teammates-job", owner=teammate)
    outsiders = make_job(name="outsiders-job", owner=outsider)

    def ids_for(user) -> set[int]:
        return set(listed_job_ids(login(user).get(reverse("jobs:list")).content.decode()))

    assert ids_for(owner) == {owners.pk}
    assert ids_for(teammate) == {owners.pk, teammates.pk}
    assert ids_for(outsider) == {outsiders.pk}
    assert ids_for(staff) == {owners.pk, teammates.pk, outsiders.pk}
