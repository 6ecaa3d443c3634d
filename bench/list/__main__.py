"""Benchmark: the Training Job list page and list API with 10,000 jobs.

    .venv/bin/python -m bench.list [--jobs 10000] [--requests 30]

The pager's count stops at 10,000 (``console.paging``); the last line times the exact COUNT
against that capped one, and the first page's query, at both sizes. Builds a throw-away SQLite console, fills it with jobs of one owner (plus other users' jobs the
owner must not see), and times requests through Django's full request path (middleware, auth,
templates / serializers) with the test client: server time per request (median, p95) and queries
per request, for page sizes 20, 50 and 100. Baseline in the same run: the same requests against a
console holding 100 jobs. Queries per request must not grow with the page size.
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


def measure(client, url: str, requests: int) -> tuple[float, float, int]:
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
    return statistics.median(times) * 1000, times[int(0.95 * (len(times) - 1))] * 1000, max(queries)


def count_figures(big, small, requests: int) -> str:
    """The pager's count (what grew with the table): the exact COUNT against the capped one the
    list uses (console.paging), and the page's own query, each at both table sizes."""
    from console.paging import capped_count
    from jobs.models import TrainingJob

    def median_ms(fn) -> float:
        samples = []
        for _ in range(requests):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        return statistics.median(samples) * 1000

    rows = []
    for label, user in (("jobs", big), ("baseline", small)):
        jobs = TrainingJob.objects.visible_to(user).order_by("-created_at", "-id")
        rows.append(
            f"{label}: exact count {median_ms(jobs.count):.1f} ms, capped count {median_ms(lambda: capped_count(jobs)):.1f} ms, "
            f"first page query {median_ms(lambda: list(jobs[:20])):.1f} ms"
        )
    return "pager count (median): " + "; ".join(rows)


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
        print(f"list benchmark: {args.jobs} jobs (baseline {args.baseline_jobs}), {args.requests} requests each, SQLite, {os.cpu_count()} cores")
        print(f"{'endpoint':<34}{'page':>5}{'median ms':>11}{'p95 ms':>9}{'queries':>9}{'base med':>10}{'ratio':>7}{'base q':>8}")
        queries_seen: dict[str, set[int]] = {}
        for label, template in (("list page /", "/?per_page={n}"), ("list API /api/v1/training-jobs/", "/api/v1/training-jobs/?limit={n}")):
            for size in (20, 50, 100):
                results = []
                for user in (big, small):
                    client = Client()
                    client.force_login(user)
                    results.append(measure(client, template.format(n=size), args.requests))
                (med, p95, q), (bmed, _bp95, bq) = results
                queries_seen.setdefault(label, set()).add(q)
                print(f"{label:<34}{size:>5}{med:>11.1f}{p95:>9.1f}{q:>9}{bmed:>10.1f}{med / bmed:>7.2f}{bq:>8}")
        print(count_figures(big, small, args.requests))
        flat = all(len(v) == 1 for v in queries_seen.values())
        print(f"queries per request constant across page sizes: {'PASS' if flat else 'FAIL'} {dict((k, sorted(v)) for k, v in queries_seen.items())}")
    return 0 if flat else 1


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    raise SystemExit(main())
