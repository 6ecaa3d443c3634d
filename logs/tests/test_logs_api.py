"""Reading a job's log through the API: forward pages from ``after``, the tail before ``before``,
a search, and clear 400s for bad parameters."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from harness.api import job_url
from logs.models import LogLine

pytestmark = pytest.mark.django_db


@pytest.fixture
def log(job) -> list[LogLine]:
    """Twenty master lines over two attempts, a worker line, and another job's line."""
    start = timezone.now()
    rows = [
        LogLine(
            job=job,
            stream="master",
            attempt=1 if seq <= 12 else 2,
            seq=seq,
            line_no=seq,
            ts=start + timedelta(seconds=seq),
            text=f"step {seq}" if seq % 5 else f"Saving checkpoint {seq}",
        )
        for seq in range(1, 21)
    ]
    rows.append(LogLine(job=job, stream="worker-1", attempt=1, seq=1, line_no=1, ts=start, text="worker up"))
    return LogLine.objects.bulk_create(rows)


def logs(api, job, query: str = "") -> dict:
    response = api.get(job_url(job, "logs") + query)
    assert response.status_code == 200, response.json()
    return response.json()


def test_the_first_page_starts_at_the_beginning(owner_api, job, log):
    page = logs(owner_api, job, "?limit=5")

    assert [line["seq"] for line in page["lines"]] == [1, 2, 3, 4, 5]
    assert page["lines"][0]["text"] == "step 1" and page["lines"][0]["attempt"] == 1
    assert set(page["lines"][0]) == {"seq", "attempt", "ts", "text"}
    assert page["next_after"] == 5
    assert page["has_more"] is True


def test_paging_with_next_after_reads_every_line_once(owner_api, job, log):
    seen: list[int] = []
    after = 0
    while True:
        page = logs(owner_api, job, f"?after={after}&limit=7")
        seen += [line["seq"] for line in page["lines"]]
        if not page["has_more"]:
            break
        after = page["next_after"]

    assert seen == list(range(1, 21))


def test_a_page_past_the_end_is_empty(owner_api, job, log):
    assert logs(owner_api, job, "?after=20") == {"lines": [], "next_after": None, "has_more": False}


def test_the_default_page_is_the_whole_short_log(owner_api, job, log):
    page = logs(owner_api, job)

    assert len(page["lines"]) == 20 and page["has_more"] is False and page["next_after"] == 20


def test_before_alone_gives_the_tail_in_ascending_order(owner_api, job, log):
    page = logs(owner_api, job, "?before=21&limit=4")

    assert [line["seq"] for line in page["lines"]] == [17, 18, 19, 20]
    assert page["has_more"] is True
    assert page["next_after"] == 20


def test_paging_back_from_the_tail(owner_api, job, log):
    page = logs(owner_api, job, "?before=4&limit=10")

    assert [line["seq"] for line in page["lines"]] == [1, 2, 3]
    assert page["has_more"] is False


def test_after_and_before_bound_a_range(owner_api, job, log):
    page = logs(owner_api, job, "?after=10&before=14")

    assert [line["seq"] for line in page["lines"]] == [11, 12, 13]
    assert [line["attempt"] for line in page["lines"]] == [1, 1, 2]


def test_q_keeps_the_lines_that_contain_it_in_any_case(owner_api, job, log):
    page = logs(owner_api, job, "?q=CHECKPOINT&limit=3")

    assert [line["seq"] for line in page["lines"]] == [5, 10, 15]
    assert page["has_more"] is True
    assert [line["seq"] for line in logs(owner_api, job, "?q=checkpoint&after=15")["lines"]] == [20]


def test_a_q_with_like_wildcards_matches_them_literally(owner_api, job, log):
    assert logs(owner_api, job, "?q=%25")["lines"] == []
    assert logs(owner_api, job, "?q=_")["lines"] == []


def test_each_stream_is_read_on_its_own(owner_api, job, log):
    page = logs(owner_api, job, "?stream=worker-1")

    assert [line["text"] for line in page["lines"]] == ["worker up"]
    assert logs(owner_api, job, "?stream=worker-2")["lines"] == []


def test_unknown_parameters_are_ignored(owner_api, job, log):
    assert len(logs(owner_api, job, "?colour=blue&limit=2")["lines"]) == 2


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("?after=abc", "after"),
        ("?after=-1", "after"),
        ("?after=1.5", "after"),
        ("?after=99999999999999999999999", "after"),
        ("?before=-3", "before"),
        ("?limit=0", "limit"),
        ("?limit=5001", "limit"),
        ("?limit=ten", "limit"),
        ("?stream=driver", "stream"),
        ("?stream=worker-0", "stream"),
        ("?stream=../master", "stream"),
        ("?stream=master%00", "stream"),
        ("?q=%00", "q"),
        ("?q=" + "x" * 1001, "q"),
    ],
)
def test_a_bad_parameter_is_a_400_naming_it(owner_api, job, log, query, field):
    response = owner_api.get(job_url(job, "logs") + query)

    assert response.status_code == 400
    assert field in response.json()
    assert isinstance(response.json()[field][0], str)


def test_the_largest_limit_is_allowed(owner_api, job, log):
    assert len(logs(owner_api, job, "?limit=5000")["lines"]) == 20
