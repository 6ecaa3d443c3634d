"""Benchmark: the Training Job list page and list API, a user with 10,000 jobs beside one with 100.

    .venv/bin/python -m bench.list [--jobs 10000] [--baseline-jobs 100] [--requests 30]

Builds a throw-away SQLite console and fills it with the jobs of two users (plus, for each, other
users' jobs they must not see): one with ``--jobs`` jobs, the baseline one with ``--baseline-jobs``,
in the same table. Times requests through Django's full request path (middleware, auth,
templates / serializers) with the test client: server time per request (median, p95, min–max
spread) and queries per request, for page sizes 20, 50 and 100, then the first page filtered by
status, side by side with the baseline user's and the ratio of their p95s.

Target (issue 31): page and API p95 <= 50 ms at 100,000 jobs and within 2x of the baseline's. The
list reads each access branch off its own index (``console.paging``); the pager's count stops at
10,000, and the line after the table times the exact COUNT against that capped one and the
branches' first page against the plain query's, at both sizes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta


def setup_django(directory: str) -> None:
    os.environ["CONSOLE_VAR_DIR"] = directory
    os.environ["SQLITE_PATH"] = os.path.join(directory, "bench.sqlite3")
    os.environ["JOB_WORK_ROOT"] = os.path.join(directory, "jobs")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    os.environ["LOG_LEVEL"] = "WARNING"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)


def fill(count: int, prefix: str):
    from django.contrib.auth.models import User
    from django.utils import timezone

    from jobs.models import TrainingJob
    from jobs.services.creation import personal_project_for
    from jobs.statuses import JobStatus

    owner, _ = User.objects.get_or_create(username=f"{prefix}-owner")
    other, _ = User.objects.get_or_create(username=f"{prefix}-other")
    statuses = list(JobStatus.values)
    now = timezone.now()
    rows = []
    for user, n in ((owner, count), (other, count // 10)):
        project = personal_project_for(user)
        for i in range(n):
            rows.append(
                TrainingJob(
                    name=f"job-{i:06d}",
                    owner=user,
                    project=project,
                    image="pytorch:2.13-py3.11",
                    command="python train.py",
                    gpus_per_node=1 + i % 8,
                    status=statuses[i % len(statuses)],
                    created_at=now - timedelta(seconds=i),
                    started_at=now - timedelta(seconds=i) if i % 3 else None,
                    failover_count=i % 4,
                )
            )
    TrainingJob.objects.bulk_create(rows, batch_size=2000)
    return owner


def measure(client, url: str, requests: int) -> tuple[float, float, float, float, int]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client.get(url)  # warm caches
    times, queries = [], []
    for _ in range(requests):
        with CaptureQueriesContext(connection) as ctx:
            start = time.perf_counter()
            response = client.get(url)
            times.append(time.perf_counter() - start)
        assert response.status_code == 200, (url, response.status_code)
        queries.append(len(ctx.captured_queries))
    times.sort()
    p95 = times[int(0.95 * (len(times) - 1))]
    return statistics.median(times) * 1000, p95 * 1000, times[0] * 1000, times[-1] * 1000, max(queries)


def count_figures(big, small, requests: int) -> str:
    """What grew with the table: the exact COUNT against the capped one the list uses, and the
    first page read through the access branches against the plain "owner OR project" query."""
    from console.paging import capped_count, list_branches, rows_between
    from jobs.models import TrainingJob

    def median_ms(fn) -> float:
        samples = []
        for _ in range(requests):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        return statistics.median(samples) * 1000

    def timings(label: str, user) -> str:
        jobs = TrainingJob.objects.visible_to(user).order_by("-created_at", "-id")
        branches = list_branches(user).rows
        return (
            f"{label}: exact count {median_ms(jobs.count):.1f} ms, capped count {median_ms(lambda: capped_count(jobs)):.1f} ms, "
            f"first page plain {median_ms(lambda: list(jobs[:20])):.1f} ms, "
            f"by branches {median_ms(lambda: list(rows_between(jobs, branches, 0, 20))):.1f} ms"
        )

    rows = [timings(label, user) for label, user in (("jobs", big), ("baseline", small))]
    return "count and first page (median): " + "; ".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--baseline-jobs", type=int, default=100)
    parser.add_argument("--requests", type=int, default=30)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as directory:
        setup_django(directory)
        from django.test import Client

        big = fill(args.jobs, "big")
        small = fill(args.baseline_jobs, "small")
        print(
            f"list benchmark: {args.jobs} jobs (baseline {args.baseline_jobs}), {args.requests} requests each, SQLite, "
            f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
        )
        print(f"{'endpoint':<44}{'page':>5}{'median':>8}{'p95':>7}{'spread':>14}{'q':>3}{'base med':>9}{'base p95':>9}{'spread':>14}{'q':>3}{'p95 ratio':>10}")
        queries_seen: dict[str, set[int]] = {}
        worst = {"page": (0.0, 0.0), "API": (0.0, 0.0)}  # (p95 ms, p95 ratio)
        cases = [("page", "list page /", "/?page_size={n}", size) for size in (20, 50, 100)]
        cases += [("API", "list API /api/v1/training-jobs/", "/api/v1/training-jobs/?limit={n}", size) for size in (20, 50, 100)]
        cases += [
            ("page", "list page /?status=group:active", "/?page_size={n}&status=group:active", 20),
            ("page", "list page /?status=Running", "/?page_size={n}&status=Running", 20),
            ("API", "list API ?status=Running", "/api/v1/training-jobs/?limit={n}&status=Running", 20),
        ]
        for kind, label, template, size in cases:
            results = []
            for user in (big, small):
                client = Client()
                client.force_login(user)
                results.append(measure(client, template.format(n=size), args.requests))
            (med, p95, low, high, q), (bmed, bp95, blow, bhigh, bq) = results
            queries_seen.setdefault(label, set()).add(q)
            ratio = p95 / bp95
            worst[kind] = (max(worst[kind][0], p95), max(worst[kind][1], ratio))
            print(
                f"{label:<44}{size:>5}{med:>8.1f}{p95:>7.1f}{f'{low:.1f}–{high:.1f}':>14}{q:>3}"
                f"{bmed:>9.1f}{bp95:>9.1f}{f'{blow:.1f}–{bhigh:.1f}':>14}{bq:>3}{ratio:>10.2f}"
            )
        print(count_figures(big, small, args.requests))
        for kind, (p95, ratio) in worst.items():
            verdict = "PASS" if p95 <= 50 and ratio <= 2 else "FAIL"
            print(f"{kind}: worst p95 {p95:.1f} ms, worst p95 ratio {ratio:.2f} (target p95 <= 50 ms and <= 2x baseline): {verdict}")
        flat = all(len(v) == 1 for v in queries_seen.values())
        print(f"queries per request constant across page sizes: {'PASS' if flat else 'FAIL'} {dict((k, sorted(v)) for k, v in queries_seen.items())}")
    return 0 if flat else 1


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    raise SystemExit(main())
