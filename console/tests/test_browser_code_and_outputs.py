"""Bring your code and take your results in a real Chromium: a .tar.gz of a directory uploaded on
the Create form runs as ``python train.py``; the Outputs tab lists what it wrote and a click
downloads a file byte-identical; the Checkpoints tab downloads the checkpoint; a second job made
on the form with a Warm start resumes from it, and its page says where it came from."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from django.conf import settings

from harness.browser import login, save_screenshot

pytestmark = [pytest.mark.slow, pytest.mark.backend_neutral]

OWNER = ("code-owner", "owner-pass-1")
EXAMPLE = Path(settings.BASE_DIR) / "examples" / "plain_pytorch.py"
NOTES = bytes(range(256)) * 16
COMMAND = 'PYTHONPATH=$CHECKPOINT_VENDOR python train.py --output-dir ./results --steps {steps} --save-every 10 && cp notes.bin "$OUTPUT_DIR/notes.bin"'


def code_archive(tmp_path: Path) -> Path:
    target = tmp_path / "my-code.tar.gz"
    with tarfile.open(target, "w:gz") as archive:
        for name, data in (("train.py", EXAMPLE.read_bytes()), ("notes.bin", NOTES)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return target


def create(page, console, name: str, command: str, *, archive: Path | None = None, warm: str = "") -> int:
    page.goto(f"{console.base_url}/training-jobs/new/")
    page.fill("#id_name", name)
    page.fill("#id_command", command)
    page.fill("#id_gpus_per_node", "0")
    if archive is not None:
        page.set_input_files("#id_code_archive", str(archive))
    if warm:
        page.fill("#id_warm_start", warm)
    page.click("button[type=submit]:has-text('Create Training Job')")
    page.wait_for_url("**/training-jobs/*/")
    return int(page.locator(".job-header").get_attribute("data-job-id"))


def log_text(console, job_id: int) -> str:
    status, body = console.api("GET", f"/api/v1/training-jobs/{job_id}/logs/?limit=1000", user=OWNER[0])
    assert status == 200, body
    return "\n".join(line["text"] for line in body["lines"])


def test_code_uploaded_on_the_form_runs_its_outputs_download_and_a_warm_start_resumes(users, page, tmp_path):
    login(page, users, *OWNER)
    first = create(page, users, "form-code", COMMAND.format(steps=20), archive=code_archive(tmp_path))
    job = users.wait_for_job(first, {"Completed", "Failed", "Pending - internalerror"}, timeout=180)
    assert job["status"] == "Completed", log_text(users, first)

    page.goto(f"{users.base_url}/training-jobs/{first}/?tab=outputs")
    row = page.locator('[data-outputs-tree="output"] tr[data-path="notes.bin"]')
    assert "4.0" in row.inner_text()  # KB
    with page.expect_download() as caught:
        row.locator("a", has_text="file").click()
    assert Path(caught.value.path()).read_bytes() == NOTES
    assert page.locator('[data-outputs-tree="work"] tr[data-path="results/concurrent_checkpoint"]').count() == 1
    save_screenshot(page, "outputs-tab")

    page.goto(f"{users.base_url}/training-jobs/{first}/?tab=checkpoints")
    with page.expect_download() as caught:
        page.locator('[data-download-checkpoint="20"]').click()
    with tarfile.open(caught.value.path()) as archive:
        names = {member.name for member in archive}
    assert "checkpoint-20/ckptlib.json" in names and caught.value.suggested_filename == "checkpoint-20.tar"

    second = create(page, users, "form-warm", COMMAND.format(steps=30), archive=code_archive(tmp_path), warm=f"{first}:20")
    assert "checkpoint step 20 of" in page.locator('[data-field="warm_start"]').inner_text()
    job = users.wait_for_job(second, {"Completed", "Failed", "Pending - internalerror"}, timeout=180)
    text = log_text(users, second)
    assert job["status"] == "Completed", text
    assert "resumed from step 20" in text and "step 30 loss" in text and "step 10 loss" not in text
    save_screenshot(page, "warm-start-details")
