"""Jobs for a test: the default image's row, ``make_job``, a writable ``/data`` volume, and what a
job's command printed (``job_output``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from harness.sandbox import default_image_ready
from jobs.models import Image
from jobs.services.creation import create_job
from logs.models import LogLine

PLATFORM_LINE_PREFIXES = (
    "[console] pull: ",
    "[console] image ",
    "[console] this node has no CDI spec",
    "[INFO] Concurrent Checkpoint library is installed",
    "[console] environment ready",
)


def job_output(job, **filters) -> list[str]:
    """What the job's command printed, in order: its log without the lines the platform writes
    while preparing the run's container."""

    lines = LogLine.objects.filter(job=job, **filters).order_by("seq").values_list("text", flat=True)
    return [line for line in lines if not line.startswith(PLATFORM_LINE_PREFIXES)]


@pytest.fixture
def data_volume(settings):
    """/data is a writable volume of every project: output directories may lie in it."""
    settings.JOB_VOLUMES = "/data:rw"


@pytest.fixture
def default_image(request, db, settings):
    """The default image's row; built in the local registry for a test that runs jobs (one marked
    ``slow``: a test of the fast lane starts no process, so it never pulls an image)."""
    if request.node.get_closest_marker("slow"):
        default_image_ready()
    image, _ = Image.objects.get_or_create(reference=settings.DEFAULT_IMAGE, defaults={"is_default": True})
    return image


@pytest.fixture
def make_job(owner, default_image) -> Callable:

    counter = {"n": 0}

    def make(**fields):
        counter["n"] += 1
        fields.setdefault("name", f"job-{counter['n']}")
        fields.setdefault("image", default_image.reference)
        fields.setdefault("command", "python -c 'print(1)'")
        fields.setdefault("gpus_per_node", 1)
        return create_job(owner=fields.pop("owner", owner), **fields)

    return make
