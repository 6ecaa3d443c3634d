"""Whether jobs run in containers here, and the default image the tests' runs pull.

The suite shares the checkout's container storage and local registry: the default image is built
once (on the first run) and pulled from there by every test's runs. Importing this module decides
``JOB_SANDBOX`` for the whole run (the root conftest registers it first): where containers cannot
run, jobs run on the host (the console processes the tests start included) and the container
tests are skipped; with ``REQUIRE_SANDBOX=1`` the run stops instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.conf import settings

from agent import engine
from agent.default_image import ensure as ensure_default_image
from harness.processes import ROOT
from jobs.services.images import qualify

ENGINE_ROOT = Path(os.environ.get("CONTAINER_ENGINE_ROOT", str(ROOT / "var" / "podman")))
os.environ["CONTAINER_ENGINE_ROOT"] = str(ENGINE_ROOT)
if os.environ.get("JOB_SANDBOX") == "off":
    SANDBOX_READY, SANDBOX_WHY = False, "JOB_SANDBOX=off"
else:
    SANDBOX_READY, SANDBOX_WHY = engine.availability(ENGINE_ROOT)
if not SANDBOX_READY and os.environ.get("JOB_SANDBOX") != "off":
    if os.environ.get("REQUIRE_SANDBOX") == "1":
        raise pytest.UsageError(f"REQUIRE_SANDBOX=1 but jobs cannot run in containers here: {SANDBOX_WHY}")
    # Jobs run on the host in this test run (the console processes the tests start included);
    # the container tests are skipped. pytest's header says so.
    os.environ["JOB_SANDBOX"] = "off"


def pytest_report_header(config) -> str:
    if SANDBOX_READY:
        return f"jobs run in containers: {SANDBOX_WHY}"
    return f"job containers: OFF for this run ({SANDBOX_WHY}); their tests are skipped. Install podman and runc to run them."


needs_sandbox = pytest.mark.skipif(not SANDBOX_READY, reason=f"jobs cannot run in containers here: {SANDBOX_WHY}")
DEFAULT_IMAGE_FIGURES: dict = {}


def default_image_ready() -> dict:
    """The local registry and the default image in it (built on the suite's first use)."""
    if not DEFAULT_IMAGE_FIGURES and SANDBOX_READY:
        name = qualify(settings.DEFAULT_IMAGE).split("/", 1)[1]
        DEFAULT_IMAGE_FIGURES.update(ensure_default_image(ENGINE_ROOT, settings.LOCAL_REGISTRY_PORT, name, log=lambda line: None))
    return DEFAULT_IMAGE_FIGURES
