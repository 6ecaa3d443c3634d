"""Sharing GPUs on screen: project usage on the list page and in the API, the operators' Queue
page with "why is this job not running", and preemptions on the Failover tab."""

from __future__ import annotations

import pytest
from django.urls import reverse

from jobs.models import JobAttempt, Project, TrainingJob
from jobs.services.placement import place_waiting_jobs

pytestmark = pytest.mark.django_db


@pytest.fixture
def team(owner, teammate):
    team = Project.objects.create(name="team", gpu_quota=4)
    team.members.add(owner, teammate)
    return team


@pytest.fixture
def borrowing(team, nodes, make_job):
    """team (quota 4) runs 9 GPUs, 5 borrowed; three 4-GPU jobs wait (one GPU is free per node)."""
    for _ in range(3):
        make_job(project=team, gpus_per_node=3)
    place_waiting_jobs()
    return [make_job(project=team, gpus_per_node=4, name=f"wait-{i}") for i in range(3)]


def test_members_read_their_projects_usage_on_the_list_page(login, owner, outsider, borrowing):
    html = login(owner).get(reverse("jobs:list")).content.decode()
    assert "<strong>team</strong>: using 9 of 4 GPUs; 5 borrowed; 3 jobs waiting" in html
    assert "team" not in login(outsider).get(reverse("jobs:list")).content.decode()


def test_past_a_thousand_the_list_page_says_more_and_the_queue_page_counts_them_all(login, owner, staff, team, default_image):
    """The list's usage line stops counting at WAITING_CAP (a count of every waiting job costs
    them all on every page); the operators' Queue page counts exactly."""
    jobs = [TrainingJob(name=f"w{i:04d}", owner=owner, project=team, image=default_image.reference, command="x") for i in range(1002)]
    TrainingJob.objects.bulk_create(jobs)
    html = login(owner).get(reverse("jobs:list")).content.decode()
    assert "<strong>team</strong>: using 0 of 4 GPUs; more than 1,000 jobs waiting" in html
    TrainingJob.objects.filter(name__in=["w0000", "w0001"]).delete()
    html = login(owner).get(reverse("jobs:list")).content.decode()
    assert "using 0 of 4 GPUs; 1000 jobs waiting" in html
    assert "1000 jobs waiting;" in login(staff).get(reverse("queue:page")).content.decode()


def test_the_api_gives_each_visible_projects_quota_and_usage(api_as, owner, outsider, team, borrowing):
    body = api_as(owner).get("/api/v1/projects/").json()
    [mine] = [p for p in body if p["name"] == "team"]
    assert (mine["gpu_quota"], mine["gpus_used"], mine["gpus_borrowed"], mine["jobs_waiting"]) == (4, 9, 5, 3)
    assert mine["summary"] == "using 9 of 4 GPUs; 5 borrowed"
    assert "team" not in [p["name"] for p in api_as(outsider).get("/api/v1/projects/").json()]
    assert api_as(outsider).get(f"/api/v1/projects/{team.pk}/").status_code == 404
    assert api_as(owner).get("/api/v1/projects/abc/").status_code == 404


def test_the_api_gives_a_waiting_jobs_place_in_line(api_as, owner, borrowing):
    place_waiting_jobs()
    body = api_as(owner).get(f"/api/v1/training-jobs/{borrowing[2].pk}/").json()
    assert body["status_reason"] == "3rd for 4 GPUs; no free capacity fits it"


def test_operators_see_the_queue_by_project_and_ask_why_a_job_waits(login, staff, borrowing):
    place_waiting_jobs()
    client = login(staff)
    html = client.get(reverse("queue:page")).content.decode()
    assert 'data-project="team"' in html
    assert "using 9 of 4 GPUs; 5 borrowed; 3 jobs waiting" in html
    assert "2nd for 4 GPUs; no free capacity fits it" in html
    why = client.get(reverse("queue:page"), {"job": borrowing[1].pk}).content.decode()
    assert "It waits in the queue: 2nd for 4 GPUs; no free capacity fits it." in why
    assert "There is no job 999999 you may see." in client.get(reverse("queue:page"), {"job": 999999}).content.decode()
    bad = client.get(reverse("queue:page"), {"job": "abc"})
    assert bad.status_code == 200 and "Enter a whole number." in bad.content.decode()


def test_a_user_sees_the_queue_of_their_own_projects_and_asks_about_their_jobs_only(login, owner, outsider, make_job):
    mine = make_job(name="mine-waits")
    theirs = make_job(owner=outsider, name="theirs-waits")
    html = login(owner).get(reverse("queue:page")).content.decode()
    assert "(your projects)" in html and "mine-waits" in html
    assert "theirs-waits" not in html and "outsider-personal" not in html
    answer = login(owner).get(reverse("queue:page"), {"job": theirs.pk}).content.decode()
    assert f"There is no job {theirs.pk} you may see." in answer and "theirs-waits" not in answer
    assert "mine-waits" in login(owner).get(reverse("queue:page"), {"job": mine.pk}).content.decode()


def test_the_failover_tab_shows_a_preemption(login, owner, nodes, make_job):
    spot = make_job(job_type="Spot")
    urgent = make_job(name="urgent")
    place_waiting_jobs()
    JobAttempt.objects.filter(job=spot).update(state="exited", reclaimed=True, preempted_for=urgent)
    html = login(owner).get(reverse("jobs:detail", args=[spot.pk]) + "?tab=failover").content.decode()
    assert "preempted for On-Demand work" in html


def test_the_list_and_the_detail_page_show_a_waiting_jobs_place_and_why(login, owner, borrowing):
    place_waiting_jobs()
    client = login(owner)
    assert "2nd for 4 GPUs; no free capacity fits it" in client.get(reverse("jobs:list")).content.decode()
    assert "2nd for 4 GPUs; no free capacity fits it" in client.get(reverse("jobs:detail", args=[borrowing[1].pk])).content.decode()
