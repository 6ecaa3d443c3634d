"""The published OpenAPI schema: valid, free of generator warnings, and describing the API as it
answers (the fuzz test checks the answers against it)."""

from __future__ import annotations

import pytest
import yaml
from django.core.management import call_command

pytestmark = pytest.mark.django_db


def test_the_schema_validates_without_warnings(tmp_path):
    target = tmp_path / "schema.yaml"

    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(target))

    assert yaml.safe_load(target.read_text())["openapi"].startswith("3.")


def test_the_schema_and_its_docs_are_served(api_as):
    client = api_as(None)

    schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200
    assert client.get("/api/docs/").status_code == 200
    assert client.get("/api/redoc/").status_code == 200


def test_the_schema_documents_every_endpoint_and_its_errors(api_as):
    paths = api_as(None).get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()["paths"]

    assert set(paths["/api/v1/training-jobs/"]) == {"get", "post"}
    assert set(paths["/api/v1/training-jobs/{id}/"]) == {"get", "delete"}
    assert set(paths["/api/v1/training-jobs/{id}/stop/"]["post"]["responses"]) == {"200", "404", "409"}
    assert "409" in paths["/api/v1/training-jobs/{id}/"]["delete"]["responses"]
    assert "requestBody" not in paths["/api/v1/training-jobs/{id}/stop/"]["post"]
    assert "CloneRequest" in str(paths["/api/v1/training-jobs/{id}/clone/"]["post"]["requestBody"])
    assert "LogPage" in str(paths["/api/v1/training-jobs/{id}/logs/"]["get"]["responses"]["200"])
    for path in ("events", "attempts"):
        assert f"/api/v1/training-jobs/{{id}}/{path}/" in paths
    assert "/api/v1/auth/token/" in paths
    assert {"/api/v1/nodes/{name}/cordon/", "/api/v1/nodes/{name}/uncordon/"} <= set(paths)
    log_parameters = {p["name"] for p in paths["/api/v1/training-jobs/{id}/logs/"]["get"]["parameters"]}
    assert log_parameters == {"id", "stream", "after", "before", "limit", "q"}
