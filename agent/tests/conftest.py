"""Fixtures of the agent's tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from agent import engine
from agent.tests.registry_fixtures import PlatformRegistry, containers_unavailable, push_tiny_image
from harness.processes import free_port


@pytest.fixture(scope="module")
def platform_registry(tmp_path_factory) -> Iterator[PlatformRegistry]:
    """A local registry as the platform starts it (``engine.ensure_registry``: the platform's
    credentials, no deletes) in an engine directory of the test module's own, holding a one-file
    image pushed by the platform. Real docker-registry and Podman, as root; skipped without."""
    root = tmp_path_factory.mktemp("engine")
    why = containers_unavailable(root)
    if why is not None:
        if os.environ.get("REQUIRE_CONTAINERS") == "1":
            pytest.fail(f"REQUIRE_CONTAINERS=1 but containers cannot run here: {why}")
        pytest.skip(f"containers cannot run here: {why}")
    address = engine.ensure_registry(root, free_port())
    try:
        reference = f"{address}/team/trainer:v1"
        yield PlatformRegistry(root, address, reference, push_tiny_image(root, reference))
    finally:
        engine.stop_registry(root)
        engine.unmount_storage(root)  # so pytest can remove the directory
