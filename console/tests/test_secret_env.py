"""Secret environment variables: encrypted at rest, •••• on every page, in the API, the admin and
clones, never logged; present in the run's environment."""

from __future__ import annotations

import hashlib
import json
import logging

import pytest
from django.db import connection
from django.urls import reverse

from harness.api import JOBS_URL, job_url
from harness.job_factory import job_output
from jobs.models import TrainingJob
from jobs.secret_env import MASK, SecretEnv, SecretUnreadable
from jobs.services.creation import personal_project_for
from jobs.statuses import JobStatus

pytestmark = pytest.mark.django_db

VALUE = "hf_secret123_do_not_show"


@pytest.fixture
def secret_job(make_job) -> TrainingJob:
    return make_job(name="with-token", env={"EPOCHS": "3", "HF_TOKEN": VALUE})


def stored_column(job: TrainingJob) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT env, secret_env FROM jobs_trainingjob WHERE id = %s", [job.pk])
        env, secret = cursor.fetchone()
    return f"{env} {secret}"


def test_a_token_named_variable_is_secret_and_stored_encrypted(secret_job):
    secret_job.refresh_from_db()
    assert secret_job.env == {"EPOCHS": "3"}
    assert secret_job.secret_env.names == ("HF_TOKEN",)
    assert secret_job.secret_env.reveal() == {"HF_TOKEN": VALUE}
    raw = stored_column(secret_job)
    assert VALUE not in raw and "HF_TOKEN" in raw
    assert VALUE not in repr(secret_job.secret_env) and VALUE not in str(secret_job.__dict__)


@pytest.mark.parametrize("name", ["HF_TOKEN", "WANDB_API_KEY", "DB_PASSWORD", "MY_SECRET", "TOKEN"])
def test_names_like_token_key_password_secret_are_secret_by_default(make_job, name):
    job = make_job(name=f"j-{name.lower().replace('_', '-')}", env={name: "v4lue", "PLAIN": "1"})
    job.refresh_from_db()
    assert job.env == {"PLAIN": "1"} and job.secret_env.names == (name,)


def test_a_secret_key_change_is_read_through_the_fallbacks(settings, secret_job):
    old = settings.SECRET_KEY
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "a-new-key-" + "x" * 40, [old]
    assert TrainingJob.objects.get(pk=secret_job.pk).secret_env.reveal() == {"HF_TOKEN": VALUE}
    settings.SECRET_KEY_FALLBACKS = []
    with pytest.raises(SecretUnreadable, match="SECRET_KEY_FALLBACKS"):
        TrainingJob.objects.get(pk=secret_job.pk).secret_env.reveal()


def test_the_details_tab_shows_the_name_and_never_the_value(login, owner, teammate, staff, secret_job):
    for user in (owner, teammate, staff):
        html = login(user).get(reverse("jobs:detail", args=[secret_job.pk])).content.decode()
        assert f"HF_TOKEN={MASK}" in html and "EPOCHS=3" in html
        assert VALUE not in html


def test_the_api_shows_the_mask_and_never_the_value(owner_api, secret_job):
    for url in (job_url(secret_job), JOBS_URL, job_url(secret_job, "events"), job_url(secret_job, "attempts")):
        text = owner_api.get(url).content.decode()
        assert VALUE not in text, url
    body = owner_api.get(job_url(secret_job)).json()
    assert body["env"] == {"EPOCHS": "3", "HF_TOKEN": MASK}
    assert "secret_env" not in body


def test_the_api_takes_secret_env_and_answers_with_the_mask(owner_api, default_image):
    response = owner_api.post(
        JOBS_URL,
        {"name": "api-secret", "command": "python train.py", "env": {"A": "1"}, "secret_env": {"S3_CREDS": VALUE}},
        format="json",
    )
    assert response.status_code == 201, response.json()
    assert VALUE not in response.content.decode()
    assert response.json()["env"] == {"A": "1", "S3_CREDS": MASK}
    job = TrainingJob.objects.get(name="api-secret")
    assert job.secret_env.reveal() == {"S3_CREDS": VALUE}


def test_the_api_refuses_the_mask_as_a_value(owner_api, default_image):
    response = owner_api.post(JOBS_URL, {"name": "masked", "command": "python t.py", "env": {"HF_TOKEN": MASK}}, format="json")
    assert response.status_code == 400
    assert "Give the value of HF_TOKEN" in response.json()["secret_env"][0]


def test_an_api_clone_keeps_the_secrets_without_showing_them(owner_api, secret_job):
    response = owner_api.post(job_url(secret_job, "clone"))
    assert response.status_code == 201
    assert VALUE not in response.content.decode()
    assert response.json()["env"] == {"EPOCHS": "3", "HF_TOKEN": MASK}
    assert TrainingJob.objects.get(pk=response.json()["id"]).secret_env.reveal() == {"HF_TOKEN": VALUE}


def test_another_users_clone_does_not_get_the_secrets(api_as, teammate, secret_job):
    response = api_as(teammate).post(job_url(secret_job, "clone"))
    assert response.status_code == 201
    clone = TrainingJob.objects.get(pk=response.json()["id"])
    assert not clone.secret_env and response.json()["env"] == {"EPOCHS": "3"}


def test_the_clone_form_shows_the_mask_and_keeps_the_value(login, owner, secret_job):
    client = login(owner)
    response = client.get(reverse("jobs:clone", args=[secret_job.pk]))
    html = response.content.decode()
    assert VALUE not in html and f"HF_TOKEN={MASK}" in html
    form = response.context["form"]
    data = {name: form[name].value() for name in form.fields if form[name].value() is not None}
    data["failover_enabled"] = "on"
    data["project"] = str(personal_project_for(owner).pk)
    response = client.post(reverse("jobs:clone", args=[secret_job.pk]), data)
    assert response.status_code == 302, response.context["form"].errors
    clone = TrainingJob.objects.exclude(pk=secret_job.pk).get(owner=owner)
    assert clone.secret_env.reveal() == {"HF_TOKEN": VALUE} and clone.env == {"EPOCHS": "3"}
    assert VALUE not in client.get(response["Location"]).content.decode()


def test_a_teammates_clone_form_asks_for_the_value_again(login, teammate, secret_job):
    client = login(teammate)
    form = client.get(reverse("jobs:clone", args=[secret_job.pk])).context["form"]
    data = {name: form[name].value() for name in form.fields if form[name].value() is not None}
    data["project"] = str(form["project"].value())
    response = client.post(reverse("jobs:clone", args=[secret_job.pk]), data)
    assert response.status_code == 200
    assert "Enter the value of HF_TOKEN" in " ".join(response.context["form"].errors["secret_env_text"])
    data["secret_env_text"] = "HF_TOKEN=hf_teammates_own"
    assert client.post(reverse("jobs:clone", args=[secret_job.pk]), data).status_code == 302
    clone = TrainingJob.objects.get(owner=teammate)
    assert clone.secret_env.reveal() == {"HF_TOKEN": "hf_teammates_own"}


def test_a_form_with_errors_does_not_echo_a_secret_back(login, owner, default_image):
    response = login(owner).post(
        reverse("jobs:create"),
        {
            "name": "Bad_Name",
            "project": str(personal_project_for(owner).pk),
            "job_type": "On-Demand",
            "image": default_image.reference,
            "command": "python t.py",
            "secret_env_text": f"HF_TOKEN={VALUE}",
            "gpus_per_node": "1",
            "node_count": "1",
        },
    )
    assert response.status_code == 200
    assert VALUE not in response.content.decode()


@pytest.mark.slow
def test_the_run_gets_the_secret_and_no_log_holds_it(make_job, drive, caplog):
    caplog.set_level(logging.DEBUG)
    script = "import os,hashlib,json; v=os.environ['HF_TOKEN']; print(json.dumps([len(v), hashlib.sha256(v.encode()).hexdigest()]))"
    job = make_job(name="secret-run", command=f'python -c "{script}"', gpus_per_node=0, env={"HF_TOKEN": VALUE})
    job = drive(job, JobStatus.COMPLETED, timeout=180)
    lines = job_output(job)
    assert json.loads(lines[-1]) == [len(VALUE), hashlib.sha256(VALUE.encode()).hexdigest()]
    assert not any(VALUE in line for line in lines)
    assert VALUE not in caplog.text
    assert SecretEnv.of({"A": VALUE}).__repr__() == f"SecretEnv(A={MASK})"


def test_a_secret_the_key_cannot_decrypt_fails_the_launch_with_a_reason(settings, make_job, drive):
    job = make_job(name="lost-key", command="true", gpus_per_node=0, env={"HF_TOKEN": VALUE})
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "a-new-key-" + "y" * 40, []
    job = drive(job, JobStatus.FAILED, timeout=60)
    assert "SECRET_KEY_FALLBACKS" in job.status_reason and VALUE not in job.status_reason


def test_a_secret_typed_into_a_form_shown_again_is_kept_without_being_shown(login, owner, default_image):
    client = login(owner)
    data = {
        "name": "Bad_Name",
        "project": str(personal_project_for(owner).pk),
        "job_type": "On-Demand",
        "image": default_image.reference,
        "command": "python t.py",
        "env_text": f"A=1\nDB_PASSWORD={VALUE}-2",
        "secret_env_text": f"HF_TOKEN={VALUE}",
        "gpus_per_node": "1",
        "node_count": "1",
    }
    response = client.post(reverse("jobs:create"), data)
    html = response.content.decode()
    assert VALUE not in html and f"HF_TOKEN={MASK}" in html
    form = response.context["form"]
    again = {name: form[name].value() for name in form.fields if form[name].value() is not None}
    again["name"] = "good-name"
    response = client.post(reverse("jobs:create"), again)
    assert response.status_code == 302, response.context["form"].errors
    job = TrainingJob.objects.get(name="good-name")
    assert job.secret_env.reveal() == {"HF_TOKEN": VALUE, "DB_PASSWORD": f"{VALUE}-2"} and job.env == {"A": "1"}
