"""Bring your code, take your results, start from another job's checkpoint: a directory packed
as satrain packs it runs as ``python train.py`` in /job/work (in a container, through the node
agent); what it wrote and its checkpoint download byte-identical; a second job warm-started from
that checkpoint resumes there; another user, ``..`` and a link get nothing."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from django.conf import settings

from harness.sandbox import needs_sandbox
from jobs.models import TrainingJob
from satrain.files import pack_directory

pytestmark = [needs_sandbox, pytest.mark.slow]

EXAMPLE = Path(settings.BASE_DIR) / "examples" / "plain_pytorch.py"
COMMAND = (
    "PYTHONPATH=$CHECKPOINT_VENDOR python train.py --output-dir ./results --steps {steps} --save-every 10 && "
    "python -c \"import shutil, os; shutil.copy('notes.txt', os.environ['OUTPUT_DIR'] + '/notes.txt')\" && "
    'ln -s /etc/passwd "$OUTPUT_DIR/leak"'
)


@pytest.fixture
def code_dir(tmp_path) -> Path:
    top = tmp_path / "my-project"
    top.mkdir()
    (top / "train.py").write_text(EXAMPLE.read_text())
    (top / "notes.txt").write_bytes(bytes(range(256)) * 40)
    (top / "data").mkdir()
    (top / "data" / "huge.bin").write_bytes(b"\0" * 4096)
    (top / ".gitignore").write_text("data/\n*.pyc\n")
    (top / "cache.pyc").write_bytes(b"x")
    return top


def upload(api, directory: Path) -> dict:
    packed = pack_directory(directory)
    archive = io.BytesIO(packed.archive)
    archive.name = "my-project.tar.gz"
    answer = api.post("/api/v1/code-bundles/", {"archive": archive}, format="multipart")
    assert answer.status_code == 201, answer.content
    return answer.json()


def create(api, **fields) -> TrainingJob:
    answer = api.post("/api/v1/training-jobs/", {"image": settings.DEFAULT_IMAGE, "gpus_per_node": 0, **fields}, format="json")
    assert answer.status_code == 201, answer.content
    return TrainingJob.objects.get(pk=answer.json()["id"])


def log_of(job) -> str:
    return "\n".join(job.log_lines.order_by("seq").values_list("text", flat=True))


def members(content: bytes) -> dict[str, bytes | None]:
    with tarfile.open(fileobj=io.BytesIO(content)) as archive:
        return {m.name: archive.extractfile(m).read() if m.isfile() else None for m in archive}


def test_code_runs_in_the_work_directory_its_results_download_and_a_warm_start_resumes(owner, owner_api, api_as, login, outsider, code_dir, drive):
    bundle = upload(owner_api, code_dir)
    assert bundle["files"] == 3  # train.py, notes.txt, .gitignore: data/ and *.pyc left out
    first = create(owner_api, name="bring-code", code=bundle["id"], command=COMMAND.format(steps=20))
    first = drive(first, {"Completed", "Failed", "Pending - internalerror"}, timeout=180)
    log = log_of(first)
    assert first.status == "Completed", (first.status_reason, log[-3000:])
    assert f"[satrain] code: bundle {bundle['id']} (3 files) copied to /job/work" in log
    assert "step 20 loss" in log

    # What it wrote, listed with sizes.
    listed = owner_api.get(f"/api/v1/training-jobs/{first.pk}/outputs/").json()
    output = {e["path"]: e for e in listed["trees"]["output"]["entries"]}
    assert output["notes.txt"]["size"] == 256 * 40 and output["leak"]["kind"] == "link"
    work = {e["path"] for e in listed["trees"]["work"]["entries"]}
    assert {"train.py", "notes.txt", "results/concurrent_checkpoint/checkpoint-20"} <= work
    assert [c["step"] for c in listed["checkpoints"] if c["available"]] == [20, 10]

    # A file byte-identical; the checkpoint as a tar, byte-identical file by file.
    notes = owner_api.get(f"/api/v1/training-jobs/{first.pk}/outputs/output/download/", {"path": "notes.txt"})
    assert notes.status_code == 200 and b"".join(notes.streaming_content) == (code_dir / "notes.txt").read_bytes()
    checkpoint = owner_api.get(f"/api/v1/training-jobs/{first.pk}/outputs/checkpoint-20/download/")
    assert checkpoint["Content-Type"] == "application/x-tar"
    on_disk = Path(settings.JOB_WORK_ROOT) / str(first.pk) / "work" / "results" / "concurrent_checkpoint" / "checkpoint-20"
    got = members(b"".join(checkpoint.streaming_content))
    expected = {f"checkpoint-20/{p.relative_to(on_disk)}": p.read_bytes() for p in on_disk.rglob("*") if p.is_file()}
    assert expected and {k: v for k, v in got.items() if v is not None} == expected

    # The page: the Outputs tab lists them with sizes and links; the Checkpoints tab downloads each.
    page = login(owner).get(f"/training-jobs/{first.pk}/?tab=outputs").content.decode()
    assert 'data-path="notes.txt"' in page and "10.0\xa0KB" in page and "(a link: not followed)" in page
    assert f"/api/v1/training-jobs/{first.pk}/outputs/output/download/?path=notes.txt" in page
    assert f"/api/v1/training-jobs/{first.pk}/outputs/checkpoint-20/download/" in page
    page = login(owner).get(f"/training-jobs/{first.pk}/?tab=checkpoints").content.decode()
    assert 'data-download-checkpoint="20"' in page and 'data-download-checkpoint="10"' in page

    # Nothing for another user, nothing outside the directory, no link followed.
    other = api_as(outsider)
    assert other.get(f"/api/v1/training-jobs/{first.pk}/outputs/").status_code == 404
    assert other.get(f"/api/v1/training-jobs/{first.pk}/outputs/output/download/", {"path": "notes.txt"}).status_code == 404
    outside = owner_api.get(f"/api/v1/training-jobs/{first.pk}/outputs/output/download/", {"path": "../work/train.py"})
    assert outside.status_code == 400 and "'..' is not allowed" in outside.json()["detail"]
    link = owner_api.get(f"/api/v1/training-jobs/{first.pk}/outputs/output/download/", {"path": "leak"})
    assert link.status_code == 404 and "links are never followed" in link.json()["detail"]
    assert other.post("/api/v1/training-jobs/", {"name": "steal", "code": bundle["id"], "command": "true"}, format="json").status_code == 400
    refused = other.post("/api/v1/training-jobs/", {"name": "steal", "warm_start_job": first.pk, "command": "true"}, format="json")
    assert refused.status_code == 400 and "does not exist or you may not see it" in str(refused.json())

    # A warm start from its checkpoint at step 20: the run resumes there and goes on to 30.
    second = create(owner_api, name="warm", code=bundle["id"], warm_start_job=first.pk, command=COMMAND.format(steps=30))
    assert second.warm_start_step == 20
    second = drive(second, {"Completed", "Failed", "Pending - internalerror"}, timeout=180)
    log = log_of(second)
    assert second.status == "Completed", (second.status_reason, log[-3000:])
    assert f"[satrain] warm start: checkpoint step 20 of job {first.pk} (bring-code) copied to /job/work/results/concurrent_checkpoint/checkpoint-20" in log
    assert "resumed from step 20" in log and "step 30 loss" in log and "step 10 loss" not in log
