"""The control worker, instrumented: ``python -m bench.scale.control STATS BEAT_SCHEDULE``.

Exactly the product's control worker (``celery -A console worker -Q control -B -P solo``), with
``control_round`` and ``place_waiting_jobs`` wrapped so each round appends one JSON line to STATS:
its start (unix time), wall time of the whole round and of placement alone, the attempts placed
and the SQL statements each issued (placement's figures summed over its calls in the round) (counted by a ``connection.execute_wrapper``, which sees
every statement, executemany included, as ``CaptureQueriesContext`` would with DEBUG on).
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> int:
    stats_path, schedule_path = sys.argv[1], sys.argv[2]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    from django.db import connection

    from jobs.services import control, placement

    original_round = control.control_round
    original_place = placement.place_waiting_jobs
    out = open(stats_path, "a", buffering=1)  # noqa: SIM115 - written by the patched functions for the worker's life
    counter = {"n": 0}
    current: dict = {}
    depth = {"n": 0}

    def count(execute, sql, params, many, context):
        counter["n"] += 1
        return execute(sql, params, many, context)

    def place(*args, **kwargs):
        # A round may place several times (a round that placed tries again): the figures add up.
        # Only the outermost call counts, should placement call itself through the module.
        depth["n"] += 1
        q0, t0 = counter["n"], time.perf_counter()
        try:
            placed = original_place(*args, **kwargs)
        finally:
            depth["n"] -= 1
        if depth["n"] == 0:
            current["place_s"] = current.get("place_s", 0.0) + time.perf_counter() - t0
            current["place_q"] = current.get("place_q", 0) + counter["n"] - q0
            current["placed"] = current.get("placed", 0) + len(placed or ())
            current["place_calls"] = current.get("place_calls", 0) + 1
        return placed

    def control_round():
        current.clear()
        start, t0, q0 = time.time(), time.perf_counter(), counter["n"]
        with connection.execute_wrapper(count):
            placed = original_round()
        row = {"t": start, "round_s": time.perf_counter() - t0, "round_q": counter["n"] - q0, **current}
        out.write(json.dumps(row) + "\n")
        return placed

    for module in (control, placement):  # wherever the round finds it
        if getattr(module, "place_waiting_jobs", None) is original_place:
            module.place_waiting_jobs = place
    control.control_round = control_round

    from console.celery import app

    app.worker_main(
        ["worker", "-Q", "control", "-B", "-P", "solo", "-l", "WARNING", "-n", "control@%h", "--without-gossip", "--without-mingle", "-s", schedule_path]
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
