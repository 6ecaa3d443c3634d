"""The platform's local registry is read-only to everything but the platform: a job that reaches
127.0.0.1 (a host network, a port forwarded) gets 401 for every request without the platform's
credentials, the upload and the manifest PUT that would replace the default image included."""

from __future__ import annotations

import json

import pytest

from agent import engine

pytestmark = pytest.mark.slow  # a real docker-registry and Podman

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def test_an_anonymous_blob_upload_is_refused(platform_registry):
    status, body = platform_registry.request("POST", "/v2/team/trainer/blobs/uploads/")
    assert status == 401, body
    assert b"UNAUTHORIZED" in body


def test_an_anonymous_manifest_put_over_an_existing_tag_is_refused_and_the_tag_keeps_its_image(platform_registry):
    # The attack: the tag's manifest read and put back (a real one names a layer of its own).
    credentials = engine.platform_credentials(platform_registry.root, platform_registry.address)
    manifest = _manifest(platform_registry, credentials)
    headers = {"Content-Type": json.loads(manifest).get("mediaType", OCI_MANIFEST)}
    assert platform_registry.request("PUT", "/v2/team/trainer/manifests/v1", data=manifest, headers=headers)[0] == 401
    assert platform_registry.request("PUT", "/v2/team/trainer/manifests/v2", data=manifest, headers=headers)[0] == 401
    assert engine.resolve_digest(platform_registry.root, platform_registry.reference).digest == platform_registry.digest
    # The same request is one the registry takes from the platform: only the credentials differ.
    status, body = platform_registry.request("PUT", "/v2/team/trainer/manifests/v2", data=manifest, headers=headers, credentials=credentials)
    assert status == 201, body


def test_an_anonymous_read_is_refused_too(platform_registry):
    """docker-registry's htpasswd auth covers reads: a job cannot even copy the platform's images."""
    for path in ("/v2/", "/v2/_catalog", "/v2/team/trainer/manifests/v1", f"/v2/team/trainer/blobs/{platform_registry.digest}"):
        status, _ = platform_registry.request("GET", path)
        assert status == 401, path


def test_wrong_credentials_are_refused(platform_registry):
    status, _ = platform_registry.request("POST", "/v2/team/trainer/blobs/uploads/", credentials=(engine.PLATFORM_USER, "guess"))
    assert status == 401


def _manifest(platform_registry, credentials) -> bytes:
    status, manifest = platform_registry.request(
        "GET", "/v2/team/trainer/manifests/v1", credentials=credentials,
        headers={"Accept": f"{OCI_MANIFEST}, application/vnd.docker.distribution.manifest.v2+json"},
    )  # fmt: skip
    assert status == 200, manifest
    return manifest
