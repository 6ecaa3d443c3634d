"""The create form takes a code archive and a warm start: a job created with its bundle; an
archive over the limit or with a link said beside the Code field; a form shown again with an
error keeps the uploaded bundle; a warm start from a job the user cannot see, or a step it never
committed, said beside its field; a clone keeps both."""

from __future__ import annotations

import html
import io
import tarfile

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from django.utils import timezone

from harness.pages import field_errors as errors_in
from jobs.models import CodeBundle, TrainingJob
from jobs.services.creation import personal_project_for
from logs.models import Checkpoint

pytestmark = pytest.mark.django_db


def archive(*members: tuple[str, bytes | str]) -> SimpleUploadedFile:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as packed:
        for name, content in members:
            info = tarfile.TarInfo(name)
            if isinstance(content, str):
                info.type, info.linkname = tarfile.SYMTYPE, content
                packed.addfile(info)
            else:
                info.size = len(content)
                packed.addfile(info, io.BytesIO(content))
    return SimpleUploadedFile("my-code.tar.gz", out.getvalue(), content_type="application/gzip")


def field_errors(response, field: str) -> str:
    return html.unescape(errors_in(response.content.decode(), field))


@pytest.fixture
def valid(owner, default_image) -> dict:
    return {
        "name": "with-code",
        "project": str(personal_project_for(owner).pk),
        "job_type": "On-Demand",
        "image": default_image.reference,
        "command": "python train.py",
        "gpus_per_node": "0",
        "node_count": "1",
    }


def test_a_job_is_created_with_the_uploaded_code(login, owner, valid):
    response = login(owner).post(reverse("jobs:create"), {**valid, "code_archive": archive(("train.py", b"print('hi')\n"))})
    assert response.status_code == 302
    job = TrainingJob.objects.get(name="with-code")
    assert job.code.files == 1 and job.code.source == "my-code.tar.gz" and job.code.owner == owner
    details = login(owner).get(reverse("jobs:detail", args=[job.pk])).content.decode()
    assert f"bundle {job.code_id}" in details and "copied to /job/work before each attempt" in details


def test_a_bad_archive_is_said_beside_the_code_field(login, owner, valid, settings):
    response = login(owner).post(reverse("jobs:create"), {**valid, "code_archive": archive(("leak", "/etc/shadow"))})
    assert response.status_code == 200
    assert "'leak' is a symbolic link: a bundle holds files and directories only." in field_errors(response, "code_archive")
    settings.CODE_BUNDLE_MAX_BYTES = 1000
    response = login(owner).post(reverse("jobs:create"), {**valid, "code_archive": archive(("big.bin", b"\1" * 5000))})
    assert "over its limit of 1,000 bytes unpacked (CODE_BUNDLE_MAX_BYTES)" in field_errors(response, "code_archive")
    assert not TrainingJob.objects.exists()


def test_a_form_shown_again_keeps_the_uploaded_code(login, owner, valid):
    client = login(owner)
    response = client.post(reverse("jobs:create"), {**valid, "gpus_per_node": "-1", "code_archive": archive(("train.py", b"1"))})
    assert response.status_code == 200 and field_errors(response, "gpus_per_node")
    bundle = CodeBundle.objects.get()
    assert f'name="code" value="{bundle.pk}"' in response.content.decode()
    assert client.post(reverse("jobs:create"), {**valid, "code": str(bundle.pk)}).status_code == 302
    assert TrainingJob.objects.get(name="with-code").code_id == bundle.pk


def test_another_users_bundle_or_job_cannot_be_used(login, owner, outsider, valid, make_job):
    theirs = CodeBundle.objects.create(owner=outsider, project=personal_project_for(outsider), sha256="0" * 64, archive=b"", size=0, unpacked_size=0, files=1)
    response = login(owner).post(reverse("jobs:create"), {**valid, "code": str(theirs.pk)})
    assert "That code bundle does not exist or you may not use it" in field_errors(response, "code")
    other_job = make_job(owner=outsider, name="theirs")
    response = login(owner).post(reverse("jobs:create"), {**valid, "warm_start": str(other_job.pk)})
    assert f"Job {other_job.pk} does not exist or you may not see it." in field_errors(response, "warm_start")
    assert not TrainingJob.objects.filter(owner=owner).exists()


def test_a_warm_start_names_a_committed_step_and_a_clone_keeps_it(login, owner, valid, make_job):
    source = make_job(name="trained")
    Checkpoint.objects.create(job=source, attempt=1, step=80, path="/job/work/results/concurrent_checkpoint/checkpoint-80", committed_at=timezone.now())
    client = login(owner)
    response = client.post(reverse("jobs:create"), {**valid, "warm_start": f"{source.pk}:70"})
    assert f"Job {source.pk} (trained) has no committed checkpoint at step 70 to start from (its steps: 80)." in field_errors(response, "warm_start")
    response = client.post(reverse("jobs:create"), {**valid, "warm_start": "twelve"})
    assert "Write the job's id, or id:step, e.g. 12 or 12:80." in field_errors(response, "warm_start")
    assert client.post(reverse("jobs:create"), {**valid, "warm_start": str(source.pk)}).status_code == 302
    job = TrainingJob.objects.get(name="with-code")
    assert (job.warm_start_job_id, job.warm_start_step) == (source.pk, 80)
    details = client.get(reverse("jobs:detail", args=[job.pk])).content.decode()
    assert "checkpoint step 80 of" in details and f"job {source.pk} (trained)" in details
    clone = client.get(reverse("jobs:clone", args=[job.pk])).content.decode()
    assert f'value="{source.pk}:80"' in clone
