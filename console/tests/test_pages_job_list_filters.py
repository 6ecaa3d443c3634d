"""The list filters by status, status group and type, searches by name, sorts, and pages with the querystring kept."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from harness.pages import listed_job_ids, put_in_status
from jobs.statuses import JobStatus

pytestmark = pytest.mark.django_db


@pytest.fixture
def jobs(make_job):
    return {
        "running": put_in_status(make_job(name="alpha-run"), JobStatus.RUNNING),
        "failed": put_in_status(make_job(name="bravo-fail", job_type="Spot"), JobStatus.FAILED),
        "internal": put_in_status(make_job(name="charlie-internal"), JobStatus.INTERNAL_ERROR),
        "done": put_in_status(make_job(name="delta-done", job_type="Spot"), JobStatus.COMPLETED),
        "pending": make_job(name="echo-wait"),
    }


def listed(client, **params) -> list[int]:
    response = client.get(reverse("jobs:list"), params)
    assert response.status_code == 200
    return listed_job_ids(response.content.decode())


def test_it_filters_by_status(login, owner, jobs):
    assert listed(login(owner), status=JobStatus.RUNNING) == [jobs["running"].pk]


def test_it_filters_by_status_group(login, owner, jobs):
    client = login(owner)
    assert set(listed(client, group="error")) == {jobs["failed"].pk, jobs["internal"].pk}
    assert set(listed(client, group="active")) == {jobs["running"].pk, jobs["pending"].pk}
    assert set(listed(client, group="finished")) == {jobs["failed"].pk, jobs["internal"].pk, jobs["done"].pk}


def test_it_filters_by_type(login, owner, jobs):
    assert set(listed(login(owner), type="Spot")) == {jobs["failed"].pk, jobs["done"].pk}


def test_it_searches_by_part_of_the_name_ignoring_case(login, owner, jobs):
    assert listed(login(owner), q="CHARLIE") == [jobs["internal"].pk]


def test_filters_combine(login, owner, jobs):
    assert listed(login(owner), type="Spot", group="error") == [jobs["failed"].pk]


def test_no_match_says_so_and_offers_to_clear_the_filters(login, owner, jobs):
    html = login(owner).get(reverse("jobs:list"), {"q": "zulu"}).content.decode()
    assert "No Training Jobs match these filters." in html
    assert "Clear filters" in html


def test_unknown_filter_values_are_ignored_rather_than_failing(login, owner, jobs):
    client = login(owner)
    ids = listed(client, status="Exploded", group="nope", type="Free", sort="price", page_size="7", page="x")
    assert set(ids) == {job.pk for job in jobs.values()}


def test_it_sorts_by_name_both_ways(login, owner, jobs):
    client = login(owner)
    by_name = [jobs[k].pk for k in ("running", "failed", "internal", "done", "pending")]
    assert listed(client, sort="name") == by_name
    assert listed(client, sort="-name") == by_name[::-1]


def test_it_sorts_newest_first_by_default_and_oldest_first_on_request(login, owner, jobs):
    client = login(owner)
    created = [jobs[k].pk for k in ("running", "failed", "internal", "done", "pending")]
    assert listed(client) == created[::-1]
    assert listed(client, sort="created") == created


def test_it_sorts_by_status(login, owner, jobs):
    ids = listed(login(owner), sort="status")
    statuses = [next(j.status for j in jobs.values() if j.pk == pk) for pk in ids]
    assert statuses == sorted(statuses)


def test_column_headers_link_to_sorting_and_keep_the_filters(login, owner, jobs):
    html = login(owner).get(reverse("jobs:list"), {"type": "Spot", "sort": "name"}).content.decode()
    assert 'href="?type=Spot&amp;sort=-name"' in html  # name is sorted ascending: its header flips it
    assert 'href="?type=Spot&amp;sort=status"' in html


@pytest.mark.parametrize("page_size", [20, 50, 100])
def test_it_pages_with_the_chosen_page_size(login, owner, make_job, page_size):
    made = [make_job(name=f"job-{n:03d}") for n in range(page_size + 1)]
    client = login(owner)
    first = listed(client, page_size=page_size, sort="name")
    assert first == [job.pk for job in made[:page_size]]
    assert listed(client, page_size=page_size, sort="name", page=2) == [made[-1].pk]


def test_page_links_keep_the_filters_sort_and_page_size(login, owner, make_job):
    for n in range(45):
        make_job(name=f"spot-{n:02d}", job_type="Spot")
    html = login(owner).get(reverse("jobs:list"), {"type": "Spot", "sort": "name", "page_size": 20, "page": 2}).content.decode()
    links = dict(re.findall(r'href="([^"]+)" rel="(prev|next)"', html))
    assert {rel: href for href, rel in links.items()} == {
        "prev": "?type=Spot&amp;sort=name&amp;page_size=20&amp;page=1",
        "next": "?type=Spot&amp;sort=name&amp;page_size=20&amp;page=3",
    }
    assert "Page 2 of 3" in html


def test_the_filter_form_labels_every_input_and_keeps_the_chosen_values(login, owner, jobs):
    html = login(owner).get(reverse("jobs:list"), {"q": "alpha", "type": "Spot", "page_size": 50}).content.decode()
    for field in ("q", "status", "type", "sort", "page_size"):
        assert f'<label for="id_{field}">' in html
    assert 'value="alpha"' in html
    assert '<option value="Spot" selected>' in html
    assert '<option value="50" selected>' in html


def test_one_status_select_offers_groups_and_exact_statuses(login, owner, jobs):
    client = login(owner)
    html = client.get(reverse("jobs:list")).content.decode()
    assert 'id="id_group"' not in html and "Status group" not in html
    assert '<optgroup label="Groups">' in html and '<optgroup label="Exact status">' in html
    assert set(listed(client, status="group:error")) == {jobs["failed"].pk, jobs["internal"].pk}
    kept = client.get(reverse("jobs:list"), {"group": "error"}).content.decode()
    assert '<option value="group:error" selected>' in kept
