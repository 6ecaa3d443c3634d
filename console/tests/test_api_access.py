"""Who may see and act on a job: its owner and the project's members, and staff; an outsider
learns nothing (404), whatever the endpoint."""

from __future__ import annotations

import pytest

from harness.api import JOBS_URL, job_url, move_to
from jobs.models import TrainingJob
from jobs.statuses import JobStatus

pytestmark = pytest.mark.django_db

READS = ["", "events", "attempts", "logs"]


@pytest.fixture
def everyone(owner, teammate, outsider, staff) -> dict:
    return {"owner": owner, "teammate": teammate, "outsider": outsider, "staff": staff}


@pytest.mark.parametrize("who", ["owner", "teammate", "staff"])
@pytest.mark.parametrize("endpoint", READS)
def test_the_owner_a_teammate_and_staff_may_read_a_job(api_as, everyone, job, who, endpoint):
    response = api_as(everyone[who]).get(job_url(job, endpoint))

    assert response.status_code == 200


@pytest.mark.parametrize("endpoint", READS)
def test_an_outsider_gets_404_for_every_read_of_a_job(api_as, outsider, job, endpoint):
    response = api_as(outsider).get(job_url(job, endpoint))

    assert response.status_code == 404
    assert "bert-finetune" not in response.content.decode()


def test_an_outsider_may_not_stop_a_job(api_as, outsider, job):
    assert api_as(outsider).post(job_url(job, "stop")).status_code == 404
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING


def test_an_outsider_may_not_clone_a_job(api_as, outsider, job):
    assert api_as(outsider).post(job_url(job, "clone"), {}, format="json").status_code == 404
    assert TrainingJob.objects.count() == 1


def test_an_outsider_may_not_delete_a_job(api_as, outsider, job):
    move_to(job, JobStatus.COMPLETED)

    assert api_as(outsider).delete(job_url(job)).status_code == 404
    assert TrainingJob.objects.filter(pk=job.pk).exists()


@pytest.mark.parametrize("who", ["owner", "teammate", "staff"])
def test_the_owner_a_teammate_and_staff_may_stop_a_job(api_as, everyone, job, who):
    response = api_as(everyone[who]).post(job_url(job, "stop"))

    assert response.status_code == 200
    assert response.json()["status"] == "Stopped"


@pytest.mark.parametrize("who", ["owner", "teammate", "staff"])
def test_the_owner_a_teammate_and_staff_may_delete_a_finished_job(api_as, everyone, job, who):
    move_to(job, JobStatus.FAILED)

    assert api_as(everyone[who]).delete(job_url(job)).status_code == 204
    assert not TrainingJob.objects.filter(pk=job.pk).exists()


@pytest.mark.parametrize("who", ["owner", "teammate", "staff"])
def test_the_owner_a_teammate_and_staff_may_clone_a_job(api_as, everyone, job, who):
    response = api_as(everyone[who]).post(job_url(job, "clone"), {}, format="json")

    assert response.status_code == 201
    assert response.json()["owner"] == everyone[who].username


def test_the_list_shows_a_user_only_the_jobs_of_their_projects(api_as, owner, teammate, outsider, make_job):
    make_job(name="owners-job")
    make_job(name="teammates-own", owner=teammate)
    make_job(name="outsiders-job", owner=outsider)

    def names(user) -> set[str]:
        return {j["name"] for j in api_as(user).get(JOBS_URL).json()["results"]}

    assert names(owner) == {"owners-job"}
    assert names(teammate) == {"owners-job", "teammates-own"}
    assert names(outsider) == {"outsiders-job"}


def test_staff_see_every_job(api_as, staff, teammate, outsider, make_job):
    make_job(name="owners-job")
    make_job(name="teammates-own", owner=teammate)
    make_job(name="outsiders-job", owner=outsider)

    body = api_as(staff).get(JOBS_URL).json()

    assert body["count"] == 3
    assert {j["name"] for j in body["results"]} == {"owners-job", "teammates-own", "outsiders-job"}


@pytest.mark.parametrize(("method", "endpoint"), [("get", ""), ("get", "logs"), ("post", "stop"), ("delete", "")])
def test_an_anonymous_caller_is_refused(api_as, job, method, endpoint):
    response = getattr(api_as(None), method)(job_url(job, endpoint))

    assert response.status_code in (401, 403)


def test_anonymous_callers_may_not_list_jobs(api_as, job):
    assert api_as(None).get(JOBS_URL).status_code in (401, 403)


@pytest.mark.parametrize("bad_id", ["abc", "-1", "0", "1.5", "99999999999999999999999999", "%00", "%F0%9F%98%80"])
def test_an_id_that_is_not_a_job_is_a_json_404(api_as, owner, job, bad_id):
    response = api_as(owner).get(f"{JOBS_URL}{bad_id}/")

    assert response.status_code == 404
    assert response.json()["detail"]
