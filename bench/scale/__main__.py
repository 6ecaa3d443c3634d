"""``python -m bench.scale``: see ``bench/scale/__init__.py``."""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from bench.scale.stats import ms, ratio


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__)
    p.add_argument("--jobs", type=int, default=None, help="jobs to queue (1000; --quick 200)")
    p.add_argument("--agents", type=int, default=None, help="node agent processes (16; --quick 4)")
    p.add_argument("--gpus-per-agent", type=int, default=8, help="simulated GPUs per node (8)")
    p.add_argument("--baseline-agents", type=int, default=None, help="agents of the baseline run (a quarter, at least 1; 0: none)")
    p.add_argument("--quick", action="store_true", help="200 jobs, 4 agents, baseline 1 agent")
    p.add_argument("--command", default='python -c "pass"', help="each job's command")
    p.add_argument("--gpus-per-job", type=int, default=1)
    p.add_argument(
        "--submit", choices=("bulk", "each"), default="bulk", help="bulk: one transaction and one placement request; each: create_job per job (a request each)"
    )
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per scenario before giving up")
    p.add_argument("--pg", default=os.environ.get("TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres"))
    p.add_argument("--redis", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"), help="flushed at start and end")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs, run files)")
    a = p.parse_args()
    a.jobs = a.jobs or (200 if a.quick else 1000)
    a.agents = a.agents or (4 if a.quick else 16)
    if a.baseline_agents is None:
        a.baseline_agents = max(1, a.agents // 4) if a.agents > 1 else 0
    return a


def setup_django(env: dict[str, str]) -> None:
    for key in ("DATABASE_URL", "REDIS_URL", "CONSOLE_VAR_DIR", "JOB_WORK_ROOT", "SECRET_KEY", "SIMULATED_GPUS", "LOG_LEVEL"):
        os.environ[key] = env[key]
    os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
    import django

    django.setup()


def machine() -> str:
    import psutil

    return f"{os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB"


def print_result(r, base) -> None:
    f = r.figures
    b = base.figures if base else {}

    def row(name: str, value: str, bvalue: str = "", rat: str = "") -> None:
        print(f"  {name:<52}{value:>12}{bvalue:>12}{rat:>9}")

    head = f"{r.agents} agents"
    print()
    print(
        f"== {r.jobs} jobs, {r.agents} node agents x {r.gpus // r.agents} GPUs = {r.gpus} GPUs"
        + (f"  (baseline: {base.agents} agent{'s' if base.agents != 1 else ''}, {base.gpus} GPUs)" if base else "")
    )
    row("", head, f"{base.agents} agents" if base else "", "ratio" if base else "")

    def num(key: str, fmt: str = "{:.1f}") -> tuple[str, str, str]:
        v, bv = f.get(key, math.nan), b.get(key, math.nan)
        s = lambda x: "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)  # noqa: E731
        return s(v), (s(bv) if base else ""), (ratio(v, bv) if base else "")

    print(" statuses:", r.statuses, (f"| baseline {base.statuses}" if base else ""), "TIMED OUT" if r.timed_out else "")
    print(" throughput")
    row("placement, observed (jobs/s, first..last attempt)", *num("placement_rate_observed"))
    row("placement, engine (placed / s inside placement)", *num("placement_rate_engine"))
    row("largest round: attempts placed", *num("burst_placed", "{:.0f}"))
    row("largest round: jobs/s", *num("burst_rate"))
    row("completion (jobs/s, queued -> last Completed)", *num("completion_rate", "{:.2f}"))
    row("time until all jobs done (s)", *num("makespan_s"))
    row("submission (s)", *num("submit_s", "{:.2f}"))
    print(" dispatch latency, ms (p50 / p95 / p99 / max)")
    for name, s in r.latency.items():
        bs = base.latency.get(name) if base else None
        value = f"{ms(s['p50'])}/{ms(s['p95'])}/{ms(s['p99'])}/{ms(s['max'])}"
        bvalue = f"{ms(bs['p50'])}/{ms(bs['p95'])}/{ms(bs['p99'])}/{ms(bs['max'])}" if bs else ""
        print(f"  {name:<66}{value:>22}   {bvalue}")
        if name.startswith("dispatch") and bs:
            print(f"  {'  p95 ratio (this / baseline)':<66}{ratio(s['p95'], bs['p95']):>22}")
    print(" database queries (control worker, counted by an execute_wrapper)")

    def per(key: str, fig: dict) -> float:
        placed = fig.get("placed_in_rounds") or math.nan
        return fig.get(key, math.nan) / placed

    for key, label in (
        ("queries_place_total", "per placement, all rounds"),
        ("queries_place_productive", "per placement, rounds that placed"),
        ("queries_round_total", "per placement, whole control round (sweeps too)"),
    ):
        v, bv = per(key, f), (per(key, b) if base else math.nan)
        row(label, f"{v:.2f}", f"{bv:.2f}" if base else "", ratio(v, bv) if base else "")
    bq = (f.get("queries_burst", 0) / f["burst_placed"]) if f.get("burst_placed") else math.nan
    bbq = (b.get("queries_burst", 0) / b["burst_placed"]) if base and b.get("burst_placed") else math.nan
    row("per placement, largest round", f"{bq:.2f}", f"{bbq:.2f}" if base else "", ratio(bq, bbq) if base else "")
    row("queries of a round that placed nothing (p50)", *num("queries_empty_round_p50", "{:.0f}"))
    row("control rounds (that placed something)", f"{f['rounds']} ({f['rounds_productive']})", f"{b['rounds']} ({b['rounds_productive']})" if base else "")
    row(
        "control round wall ms p50 / max",
        f"{f['round_s_p50'] * 1000:.0f}/{f['round_s_max'] * 1000:.0f}",
        f"{b['round_s_p50'] * 1000:.0f}/{b['round_s_max'] * 1000:.0f}" if base else "",
    )
    row("control worker busy in rounds (s)", *num("control_busy_s"))
    row("max control queue length (pending place_jobs)", *num("max_control_queue", "{:.0f}"))
    row("attempts / failovers", f"{f['attempts']}/{f['failovers']}", f"{b['attempts']}/{b['failovers']}" if base else "")
    print(" CPU seconds (share of what the cores offered)")
    for res, tag in ((r, f"{r.agents} agents"), (base, f"{base.agents} agents" if base else "")):
        if res is None:
            continue
        idle = res.idle_cpu
        print(
            f"  [{tag}] idle cluster, before queueing: {idle['busy'] / idle['available'] * 100:.0f}% busy "
            f"(node agents {idle['parts']['node agents'] / (idle['available'] / os.cpu_count()) * 100:.0f}% of one core, "
            f"postgres {idle['parts']['postgres'] / (idle['available'] / os.cpu_count()) * 100:.0f}%; "
            f"{idle['pg_tx_per_s']:.0f} PostgreSQL transactions/s = {idle['pg_tx_per_s'] / res.agents:.0f} per agent incl. control)"
        )
        c = res.cpu
        parts = ", ".join(f"{k} {v:.1f}" for k, v in c["parts"].items())
        print(f"  [{tag}] queued -> done: {c['busy']:.1f} of {c['available']:.1f} ({c['busy'] / c['available'] * 100:.0f}%): {parts}")


def main() -> int:
    args = parse()
    from bench.scale.cluster import Cluster

    keep_dir = None
    tmp = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    cluster = Cluster(tmp, args.pg, args.redis, f"bench_scale_{os.getpid()}", args.gpus_per_agent)
    setup_django(cluster.env)

    def on_term(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    results = []
    try:
        print(
            f"scale benchmark: {args.jobs} jobs ({args.command!r}, {args.gpus_per_job} GPU each, submit {args.submit}) "
            f"over {args.agents} node agents x {args.gpus_per_agent} GPUs; baseline {args.baseline_agents or 'none'}; "
            f"machine: {machine()}; PostgreSQL + Redis on loopback; work dir {tmp}"
        )
        from bench.scale.scenario import run_scenario

        plan = [("main", args.agents)] + ([("base", args.baseline_agents)] if args.baseline_agents else [])
        for label, agents in plan:
            t0 = time.monotonic()
            results.append(
                run_scenario(
                    cluster,
                    label=label,
                    agents=agents,
                    gpus_per_agent=args.gpus_per_agent,
                    jobs=args.jobs,
                    command=args.command,
                    gpus_per_job=args.gpus_per_job,
                    submit_mode=args.submit,
                    timeout=args.timeout,
                )
            )
            print(f"[{label}] done in {time.monotonic() - t0:.0f}s")
        print_result(results[0], results[1] if len(results) > 1 else None)
        bad = any(r.timed_out or r.statuses.get("Completed", 0) != r.jobs for r in results)
        if bad:
            keep_dir = tmp
        return 1 if bad else 0
    except KeyboardInterrupt:
        print("interrupted; cleaning up", file=sys.stderr)
        return 130
    except Exception:
        keep_dir = tmp
        raise
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not stop the clean-up
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        from django.db import connections

        connections.close_all()
        cluster.stop()
        try:
            cluster.drop()
            cluster.redis().flushdb()
        except Exception as exc:
            print(f"clean-up: {exc}", file=sys.stderr)
        if args.keep or keep_dir:
            print(f"work directory kept: {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    raise SystemExit(main())
