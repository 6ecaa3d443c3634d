"""Secrets written in the Command (``HF_TOKEN=hf_… python …``) are kept like the Environment
field's: taken out of the stored command into the job's encrypted variables at creation (form,
API, clone), shown as ••••, given to the run with the job's other secrets; a name the Environment field sets too is refused."""

from __future__ import annotations

import pytest
from django.db import connection
from django.urls import reverse

from harness.api import JOBS_URL, job_url
from harness.pages import shows
from jobs.models import TrainingJob
from jobs.secret_env import MASK
from jobs.services.creation import personal_project_for

pytestmark = pytest.mark.django_db

VALUE = "hf_secret123"
COMMAND = f"HF_TOKEN={VALUE} WANDB_API_KEY=abc python -m x"


def stored_row(job: TrainingJob) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT command, env, secret_env FROM jobs_trainingjob WHERE id = %s", [job.pk])
        return " ".join(map(str, cursor.fetchone()))


def form_data(owner, image: str, **fields: str) -> dict[str, str]:
    return {
        "name": "from-form",
        "project": str(personal_project_for(owner).pk),
        "job_type": "On-Demand",
        "image": image,
        "command": COMMAND,
        "gpus_per_node": "0",
        "node_count": "1",
        **fields,
    }


def assert_kept_secret(job: TrainingJob) -> None:
    """The stored command has no value; the encrypted variables, which the run's environment is
    given, hold them (decrypted here as the agent decrypts them)."""
    job = TrainingJob.objects.get(pk=job.pk)
    assert job.command == "python -m x"
    assert job.secret_env.reveal() == {"HF_TOKEN": VALUE, "WANDB_API_KEY": "abc"}
    assert VALUE not in stored_row(job) and "HF_TOKEN" in stored_row(job)


def test_an_api_job_stores_and_shows_its_command_without_the_secrets(api_as, owner, teammate, default_image):
    response = api_as(owner).post(JOBS_URL, {"name": "from-api", "command": COMMAND, "gpus_per_node": 0}, format="json")

    assert response.status_code == 201, response.json()
    assert VALUE not in response.content.decode()
    assert response.json()["command"] == "python -m x"
    assert response.json()["env"] == {"HF_TOKEN": MASK, "WANDB_API_KEY": MASK}
    job = TrainingJob.objects.get(name="from-api")
    assert_kept_secret(job)
    for user in (owner, teammate):
        text = api_as(user).get(job_url(job)).content.decode()
        assert VALUE not in text and "python -m x" in text


def test_a_form_job_stores_and_shows_its_command_without_the_secrets(login, owner, teammate, default_image):
    response = login(owner).post(reverse("jobs:create"), form_data(owner, default_image.reference))

    assert response.status_code == 302, response.context["form"].errors
    job = TrainingJob.objects.get(name="from-form")
    assert_kept_secret(job)
    for user in (owner, teammate):
        html = login(user).get(reverse("jobs:detail", args=[job.pk])).content.decode()
        assert VALUE not in html
        assert shows(html, "python -m x") and f"HF_TOKEN={MASK}" in html


def test_a_name_the_environment_sets_too_is_refused_on_the_command(api_as, owner, login, default_image):
    api = api_as(owner)
    for env in ({"env": {"HF_TOKEN": "hf_other"}}, {"secret_env": {"HF_TOKEN": "hf_other"}}):
        response = api.post(JOBS_URL, {"name": "both", "command": COMMAND, **env}, format="json")
        assert response.status_code == 400
        assert "HF_TOKEN is set both in the command and in the environment variables" in response.json()["command"][0]

    response = login(owner).post(reverse("jobs:create"), form_data(owner, default_image.reference, secret_env_text="HF_TOKEN=hf_other"))
    assert response.status_code == 200
    assert "HF_TOKEN is set both in the command" in " ".join(response.context["form"].errors["command"])
    assert not TrainingJob.objects.exists()


def test_a_secret_before_a_shell_operator_is_refused_rather_than_kept_in_the_clear(api_as, owner, default_image):
    response = api_as(owner).post(JOBS_URL, {"name": "op", "command": f"HF_TOKEN={VALUE} && python x.py"}, format="json")

    assert response.status_code == 400
    assert "HF_TOKEN is set in the command before '&'" in response.json()["command"][0]
    assert VALUE not in response.content.decode()


def test_a_value_the_shell_expands_stays_in_the_command(make_job):
    job = make_job(command="HF_TOKEN=$(cat /run/token) python x.py")
    job.refresh_from_db()

    assert job.command == "HF_TOKEN=$(cat /run/token) python x.py" and not job.secret_env


def test_the_owners_clone_keeps_the_secrets_and_a_teammates_does_not(api_as, owner, teammate, make_job):
    source = make_job(name="source", command=COMMAND)

    mine = api_as(owner).post(job_url(source, "clone"))
    theirs = api_as(teammate).post(job_url(source, "clone"))

    assert mine.status_code == theirs.status_code == 201
    assert VALUE not in mine.content.decode() + theirs.content.decode()
    assert mine.json()["command"] == theirs.json()["command"] == "python -m x"
    assert TrainingJob.objects.get(pk=mine.json()["id"]).secret_env.reveal() == {"HF_TOKEN": VALUE, "WANDB_API_KEY": "abc"}
    assert not TrainingJob.objects.get(pk=theirs.json()["id"]).secret_env


def test_the_clone_page_keeps_the_secrets_without_showing_them(login, owner, make_job):
    source = make_job(name="source", command=COMMAND)
    client = login(owner)
    response = client.get(reverse("jobs:clone", args=[source.pk]))
    assert VALUE not in response.content.decode()
    form = response.context["form"]
    data = {name: form[name].value() for name in form.fields if form[name].value() is not None}

    assert client.post(reverse("jobs:clone", args=[source.pk]), data).status_code == 302
    assert_kept_secret(TrainingJob.objects.exclude(pk=source.pk).get())


def test_a_form_shown_again_with_an_error_does_not_echo_the_commands_secret(login, owner, default_image):
    client = login(owner)
    response = client.post(reverse("jobs:create"), form_data(owner, default_image.reference, name="Bad_Name"))
    html = response.content.decode()
    assert response.status_code == 200
    assert VALUE not in html and f"HF_TOKEN={MASK}" in html

    form = response.context["form"]
    again = {name: form[name].value() for name in form.fields if form[name].value() is not None}
    again["name"] = "good-name"
    assert client.post(reverse("jobs:create"), again).status_code == 302
    assert_kept_secret(TrainingJob.objects.get(name="good-name"))
