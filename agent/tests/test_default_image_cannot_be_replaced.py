"""Issue 42's attack on the default image, against the registry the embedded default runs
(var/podman, port 5000): a job on loopback read the manifest of ``pytorch:2.13-py3.11``, uploaded
a layer and PUT the manifest back under the same tag. Each step is refused without the platform's
credentials, and the platform's own pull of the image still works."""

from __future__ import annotations

import pytest
from django.conf import settings

from agent import engine
from agent.tests.registry_fixtures import registry_request
from harness.sandbox import ENGINE_ROOT, default_image_ready, needs_sandbox
from jobs.services.images import qualify

pytestmark = [needs_sandbox, pytest.mark.slow]

MANIFEST_TYPES = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"


def test_a_job_can_neither_read_upload_nor_put_the_default_images_manifest():
    figures = default_image_ready()
    address, name = qualify(settings.DEFAULT_IMAGE).split("/", 1)
    repository, tag = name.rsplit(":", 1)
    assert figures["alias"] == f"{address}/{name}"
    before = engine.resolve_digest(ENGINE_ROOT, figures["alias"])
    assert before.ok, before.message

    assert registry_request("GET", f"http://{address}/v2/{repository}/manifests/{tag}", headers={"Accept": MANIFEST_TYPES})[0] == 401
    assert registry_request("POST", f"http://{address}/v2/{repository}/blobs/uploads/")[0] == 401
    credentials = engine.platform_credentials(ENGINE_ROOT, address)
    status, manifest = registry_request("GET", f"http://{address}/v2/{repository}/manifests/{tag}", headers={"Accept": MANIFEST_TYPES}, credentials=credentials)
    assert status == 200
    put = registry_request("PUT", f"http://{address}/v2/{repository}/manifests/{tag}", data=manifest,
                   headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"})  # fmt: skip
    assert put[0] == 401, put

    pulled = engine.pull(ENGINE_ROOT, figures["alias"])
    assert pulled.ok and pulled.digest == before.digest, pulled.message
