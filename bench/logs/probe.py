"""``python -m bench.logs.probe <out.json> runconsole --port N``: the console, instrumented.

For ``--diagnose`` runs only: wraps the agent's ``control_round``, ``NodeAgent.collect``/``drain``,
``ingest_lines`` and ``JobLogConsumer.flush`` with timers, and measures the server event loop's lag
(how late a 10 ms sleep wakes up: time the loop could not run because of the GIL or blocking work).
Writes the figures to ``out.json`` when the console exits. Product code is not changed.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from collections import defaultdict


def main() -> None:
    out_path = sys.argv[1]
    argv = ["manage.py", *sys.argv[2:]]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    stats: dict[str, list] = defaultdict(list)

    def timed(name, fn, size=None):
        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                stats[name].append((time.time(), time.perf_counter() - t, size(a, kw) if size else 0))

        return wrapper

    import agent.loop as loop_mod
    import agent.node_agent as local
    import agent.output as output
    from logs.consumers import JobLogConsumer

    output.ingest_lines = timed("ingest_lines", output.ingest_lines, lambda a, kw: len(kw["lines"]))
    local.NodeAgent.collect = timed("collect", local.NodeAgent.collect)
    local.NodeAgent.drain = timed("drain", local.NodeAgent.drain)
    loop_mod.embedded_round = timed("control_round", loop_mod.embedded_round)

    orig_flush = JobLogConsumer.flush

    async def flush(self):
        n = len(self.pending)
        t = time.perf_counter()
        await orig_flush(self)
        if n:
            stats["ws_flush"].append((time.time(), time.perf_counter() - t, n))

    JobLogConsumer.flush = flush

    def lag_monitor():
        import asyncio

        from jobs import realtime

        while realtime._server_loop is None:
            time.sleep(0.1)

        async def watch():
            while True:
                t = time.perf_counter()
                await asyncio.sleep(0.01)
                stats["loop_lag"].append((time.time(), time.perf_counter() - t - 0.01, 0))

        asyncio.run_coroutine_threadsafe(watch(), realtime._server_loop)

    threading.Thread(target=lag_monitor, daemon=True).start()

    def dump():
        with open(out_path, "w") as fh:
            json.dump(stats, fh)

    atexit.register(dump)
    from django.core.management import execute_from_command_line

    execute_from_command_line(argv)


if __name__ == "__main__":
    main()


def summarize(stats: dict, window: tuple[float, float]) -> list[str]:
    """Lines of text: per timer, calls, p50/p95/max ms and sizes, within ``window``."""
    from bench.logs.stats import quantile

    lo, hi = window
    out = []
    for name in ("control_round", "collect", "drain", "ingest_lines", "ws_flush", "loop_lag"):
        rows = [r for r in stats.get(name, []) if lo <= r[0] <= hi]
        if not rows:
            continue
        ds = [r[1] * 1000 for r in rows]
        sizes = [r[2] for r in rows]
        line = f"{name:<14} n={len(rows):>6}  p50 {quantile(ds, 0.5):7.1f}  p95 {quantile(ds, 0.95):7.1f}  max {max(ds):7.1f} ms  total {sum(ds) / 1000:6.2f} s"
        if any(sizes):
            busy = sum(ds) / 1000
            line += f"  size p50 {quantile(sizes, 0.5):.0f} max {max(sizes)}  ({sum(sizes) / busy:,.0f} lines/s while busy)" if busy else ""
        out.append(line)
    return out
