"""The list's count stops at a cap, so its cost does not grow with the table: below it exact,
above it "More than N jobs" (the page) and N + 1 (the API's count)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from console import paging
from console.pages import jobs as job_pages
from harness.api import JOBS_URL

pytestmark = pytest.mark.django_db


@pytest.fixture
def cap_of_five(monkeypatch):
    monkeypatch.setattr(paging, "COUNT_CAP", 5)
    monkeypatch.setattr(job_pages, "COUNT_CAP", 5)


def test_below_the_cap_the_count_is_exact(login, owner, make_job, cap_of_five):
    for n in range(5):
        make_job(name=f"j{n}")
    html = login(owner).get(reverse("jobs:list")).content.decode()
    assert "5 jobs" in html and "More than" not in html


def test_above_the_cap_the_page_says_more_and_still_lists_the_newest(login, owner, make_job, cap_of_five):
    for n in range(8):
        make_job(name=f"j{n}")
    response = login(owner).get(reverse("jobs:list"), {"page_size": 20})
    html = response.content.decode()
    assert "More than 5 jobs" in html
    assert "j7" in html and "j0" in html  # the page itself is not cut by the cap


def test_above_the_cap_the_api_count_is_cap_plus_one(owner_api, make_job, cap_of_five):
    for n in range(8):
        make_job(name=f"j{n}")
    body = owner_api.get(JOBS_URL, {"limit": 3}).json()
    assert body["count"] == 6 and len(body["results"]) == 3 and body["next"]
