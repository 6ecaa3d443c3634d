"""What a hostile user sends is refused at the door, with a clear message and never a 500:
reserved environment names, output directories outside the project, bodies too big or too
deeply nested, header-breaking stream names; and records or lines a job forges change nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from django.conf import settings

from agent.output import checked_line
from harness.api import JOBS_URL
from harness.job_factory import job_output
from jobs.services.paths import project_root
from logs.services import RawLine, ingest_lines

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("command", "LD_PRELOAD=/tmp/evil.so python train.py", "LD_PRELOAD is reserved"),
        ("command", "CUDA_VISIBLE_DEVICES=0,1,2,3 python train.py", "CUDA_VISIBLE_DEVICES is set by the platform"),
        ("command", "JOB_ID=7 python train.py", "JOB_ID is set by the platform"),
        ("command", "BASH_ENV=/tmp/x python train.py", "BASH_ENV is reserved"),
        ("env", {"LD_LIBRARY_PATH": "/tmp"}, "LD_LIBRARY_PATH is reserved"),
        ("env", {"PATH": "/tmp"}, "PATH is set by the platform"),
        ("env", {"MASTER_ADDR": "evil"}, "MASTER_ADDR is set by the platform"),
    ],
)
def test_reserved_names_are_refused_with_the_reason(owner_api, field, value, says):
    response = owner_api.post(JOBS_URL, {"name": "sneaky", "command": "python train.py", field: value}, format="json")
    assert response.status_code == 400
    assert says in json.dumps(response.json())


def test_the_documented_pythonpath_prefix_is_still_allowed(owner_api):
    response = owner_api.post(JOBS_URL, {"name": "fine", "command": "PYTHONPATH=$CHECKPOINT_VENDOR python train.py"}, format="json")
    assert response.status_code == 201, response.json()


@pytest.mark.parametrize(
    "output_dir",
    ["/etc", "/tmp/anywhere", "runs/../../other-project", "../x", str(settings.VAR_DIR), str(settings.JOB_WORK_ROOT) + "/1/output"],
)
def test_output_directories_outside_the_project_are_refused(owner_api, output_dir):
    response = owner_api.post(JOBS_URL, {"name": "outdir", "command": "python t.py", "output_dir": output_dir}, format="json")
    assert response.status_code == 400
    assert "output_dir" in response.json()


def test_an_output_directory_in_the_project_data_is_accepted_and_a_relative_one_placed_there(owner_api, project):
    response = owner_api.post(JOBS_URL, {"name": "indir", "command": "python t.py", "output_dir": "runs/first"}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["output_dir"] == str(project_root(project) / "runs" / "first")


def test_a_symlink_out_of_the_project_data_is_refused(owner_api, project, tmp_path):
    root = project_root(project)
    root.mkdir(parents=True)
    (root / "escape").symlink_to(tmp_path)
    response = owner_api.post(JOBS_URL, {"name": "link", "command": "python t.py", "output_dir": "escape/out"}, format="json")
    assert response.status_code == 400


def test_a_body_too_big_is_413_and_one_nested_too_deep_is_400(owner_api):
    big = owner_api.post(JOBS_URL, json.dumps({"name": "big", "command": "python t.py", "description": "x" * 5_000_000}), content_type="application/json")
    assert big.status_code in (400, 413)
    assert "detail" in big.json() or "description" in big.json()
    deep = owner_api.post(JOBS_URL, "[" * 100_000 + "]" * 100_000, content_type="application/json")
    assert deep.status_code == 400


def test_a_stream_name_with_a_newline_is_400_not_500(owner_api, make_job):
    job = make_job()
    response = owner_api.get(f"{JOBS_URL}{job.pk}/logs/download/?stream=master%0A")
    assert response.status_code == 400
    # The JSON log API trims the value as every text field does: "master".
    response = owner_api.get(f"{JOBS_URL}{job.pk}/logs/?stream=master%0A")
    assert response.status_code == 200


@pytest.mark.parametrize(
    "record",
    [
        {"n": 99999999999999999999, "t": 1.0, "s": "x"},
        {"n": 1, "t": 1e300, "s": "x"},
        {"n": 1, "t": float("nan"), "s": "x"},
        {"n": True, "t": 1.0, "s": "x"},
        {"n": 0, "t": 1.0, "s": "x"},
        {"n": 1, "t": 1.0, "s": ["x"]},
        {"n": "1", "t": 1.0, "s": "x"},
        ["not", "a", "record"],
    ],
)
def test_an_out_of_range_record_is_skipped(record):
    assert checked_line(record) is None


def test_nul_and_lone_surrogates_are_stored_as_replacement_characters(make_job):
    job = make_job()
    now = datetime.now(UTC)
    ingest_lines(job_id=job.pk, stream="master", attempt=1, lines=[RawLine(1, now, "a\x00b"), RawLine(2, now, "c\ud800d")])
    assert job_output(job) == ["a\ufffdb", "c\ufffdd"]


@pytest.mark.slow  # manage.py check --deploy processes
def test_the_deploy_checks_are_clean_behind_an_https_public_url():
    import subprocess
    import sys

    env = {"CONSOLE_PUBLIC_URL": "https://console.example.com", "PATH": "/usr/bin:/bin", "HOME": str(settings.BASE_DIR)}
    checked = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        check=False,
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.slow  # manage.py check --deploy processes
def test_the_deploy_checks_ask_for_database_and_broker_passwords():
    """A multi-node job runs on its nodes' network: a PostgreSQL or Redis without a password
    would answer it."""
    import subprocess
    import sys

    base = {"CONSOLE_PUBLIC_URL": "https://console.example.com", "PATH": "/usr/bin:/bin", "HOME": str(settings.BASE_DIR)}
    bare = {**base, "DATABASE_URL": "postgres://console@127.0.0.1:5432/console", "REDIS_URL": "redis://127.0.0.1:6379/0"}
    checked = subprocess.run([sys.executable, "manage.py", "check", "--deploy"], check=False, cwd=settings.BASE_DIR, env=bare, capture_output=True, text=True)
    assert "console.W001" in checked.stderr + checked.stdout and "console.W002" in checked.stderr + checked.stdout
    secured = {**base, "DATABASE_URL": "postgres://console:s3cret@127.0.0.1:5432/console", "REDIS_URL": "redis://:s3cret@127.0.0.1:6379/0"}
    checked = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy"], check=False, cwd=settings.BASE_DIR, env=secured, capture_output=True, text=True
    )
    assert "console.W00" not in checked.stderr + checked.stdout
