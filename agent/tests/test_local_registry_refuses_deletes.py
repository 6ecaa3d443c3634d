"""The platform's local registry refuses deletes (``storage.delete.enabled: false``), even with
the platform's own credentials: nothing in it can be removed through the registry's API."""

from __future__ import annotations

import pytest

from agent import engine

pytestmark = pytest.mark.slow  # a real docker-registry and Podman


def test_a_manifest_delete_is_refused_even_with_the_platforms_credentials(platform_registry):
    credentials = engine.platform_credentials(platform_registry.root, platform_registry.address)
    status, body = platform_registry.request("DELETE", f"/v2/team/trainer/manifests/{platform_registry.digest}", credentials=credentials)
    assert status == 405, body
    assert b"UNSUPPORTED" in body
    assert engine.resolve_digest(platform_registry.root, platform_registry.reference).digest == platform_registry.digest


def test_an_anonymous_delete_is_refused(platform_registry):
    status, _ = platform_registry.request("DELETE", f"/v2/team/trainer/manifests/{platform_registry.digest}")
    assert status == 401


def test_the_registrys_configuration_turns_deletes_off(platform_registry):
    config = (platform_registry.root / "registry" / "config.yml").read_text()
    assert "  delete:\n    enabled: false\n" in config
