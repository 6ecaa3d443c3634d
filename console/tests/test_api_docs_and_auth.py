"""The API's docs work offline and read well; anonymous calls are told how to authenticate.

* /api/redoc/ and /api/docs/ load only this site's own (vendored) assets: no fonts, no CDN;
* /api/schema/ opens in the browser (JSON text, inline), not as a download;
* operations are tagged by resource (training-jobs, nodes, auth), never "v1";
* an anonymous API call is 401 with a WWW-Authenticate challenge, a favicon is served, and a
  refused page (403) leaves one line in the server log, not a traceback.
"""

from __future__ import annotations

import logging
import re

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("url", ["/api/redoc/", "/api/docs/"])
def test_the_api_docs_load_nothing_from_other_sites(url):
    html = Client().get(url).content.decode()
    external = re.findall(r"""(?:src|href)\s*=\s*["'](https?:)?//[^"']+""", html)
    assert external == [], external
    assert "fonts.googleapis" not in html and "cdn.jsdelivr" not in html
    assert "/static/drf_spectacular_sidecar/" in html


def test_the_schema_is_shown_in_the_browser_not_downloaded():
    response = Client().get("/api/schema/", HTTP_ACCEPT="text/html,application/xhtml+xml,*/*;q=0.8")
    assert response.status_code == 200
    assert response["Content-Type"].startswith(("application/json", "text/plain"))
    assert "attachment" not in response.get("Content-Disposition", "")
    assert response.json()["openapi"].startswith("3.")


def test_operations_are_tagged_by_resource(api_as):
    paths = api_as(None).get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()["paths"]
    tags = {tag for ops in paths.values() for op in ops.values() if isinstance(op, dict) for tag in op.get("tags", [])}
    assert "v1" not in tags and "api" not in tags
    assert paths["/api/v1/nodes/{name}/cordon/"]["post"]["tags"] == ["nodes"]
    assert paths["/api/v1/training-jobs/"]["get"]["tags"] == ["training-jobs"]


def test_an_anonymous_api_call_is_401_with_a_challenge(api_as):
    response = api_as(None).get("/api/v1/training-jobs/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Token")


def test_a_favicon_is_served():
    response = Client().get("/favicon.ico", follow=True)
    assert response.status_code == 200
    assert response.redirect_chain and response.redirect_chain[-1][0].endswith("favicon.svg")


def test_a_refused_page_logs_one_line_without_a_traceback(login, owner, caplog):
    with caplog.at_level(logging.WARNING, logger="django.request"):
        response = login(owner).get("/nodes/")
    assert response.status_code == 403
    records = [r for r in caplog.records if r.name == "django.request"]
    assert records and all(r.exc_info is None and r.exc_text is None for r in records)
    assert "Forbidden" in records[0].getMessage()
