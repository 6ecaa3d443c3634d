"""Bringing your own code: a script in a volume the project sees (an absolute path on the node)
runs as the job's command, read-only, and its output lands in the job's log."""

from __future__ import annotations

import pytest

from harness.job_factory import job_output

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_script_in_a_read_only_volume_runs_as_the_command(make_job, drive, settings, tmp_path):
    code = tmp_path / "my-code"
    code.mkdir()
    (code / "helper.py").write_text("GREETING = 'hello from my own code'\n")
    (code / "train.py").write_text(
        "import os, sys\nsys.path.insert(0, os.path.dirname(__file__))\nfrom helper import GREETING\n"
        "print(GREETING, flush=True)\n"
        "try:\n    open(os.path.join(os.path.dirname(__file__), 'x'), 'w')\nexcept OSError:\n    print('the code volume is read-only', flush=True)\n"
    )
    settings.JOB_VOLUMES = f"{code}:ro"
    job = make_job(command=f"python {code}/train.py")
    job = drive(job, {"Completed", "Failed"})
    text = "\n".join(job_output(job))
    assert job.status == "Completed", text
    assert "hello from my own code" in text
    assert "the code volume is read-only" in text
