"""The fleet benchmark's figures: one batch's, from the database and the control worker's round
lines, and the table comparing the new side with the baseline (standard library only; SQL on the
tables both trees share, so the harness needs neither tree's models)."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.stats import quantile


def spread(values: Sequence[float | None]) -> dict:
    xs = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return {"median": quantile(xs, 0.5), "min": min(xs) if xs else math.nan, "max": max(xs) if xs else math.nan, "n": len(xs)}


def fit(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least squares ``y = a + b x``: (a, b); NaN where x does not vary."""
    n = len(points)
    if n < 2:
        return math.nan, math.nan
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if not sxx:
        return math.nan, math.nan
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - b * mx, b


def control_rounds(path: Path, t0: float, t1: float) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    rounds = [json.loads(line) for line in lines if line.strip()]
    return [r for r in rounds if t0 <= r["t"] <= t1]


def batch_figures(query: Callable, stats_path: Path, first: int, last: int, t_submit: float, t_queued: float, t_end: float) -> dict:
    """Placement rate, dispatch → start latency and queries per placement of jobs ``first..last``."""
    rows = [
        (float(c), float(s) if s is not None else None)
        for c, s in query(
            "SELECT extract(epoch FROM created_at), extract(epoch FROM started_at) FROM jobs_jobattempt WHERE job_id BETWEEN %s AND %s", (first, last)
        )
    ]
    created = sorted(c for c, _ in rows)
    dispatch = [s - c for c, s in rows if s is not None]
    span = created[-1] - created[0] if len(created) > 1 else math.nan
    per_second = Counter(int(c) for c in created)
    finished = query("SELECT extract(epoch FROM max(finished_at)) FROM jobs_trainingjob WHERE id BETWEEN %s AND %s", (first, last))[0][0]
    rounds = control_rounds(stats_path, t_submit, t_end)
    productive = [r for r in rounds if r.get("placed")]
    placed = sum(r.get("placed", 0) for r in rounds)
    a, b = fit([(r["placed"], r.get("place_q", 0)) for r in productive])
    return {
        "attempts": len(rows),
        "submit_s": t_queued - t_submit,
        "placed_per_s": (len(created) - 1) / span if span and not math.isnan(span) else math.nan,
        "placement_span_s": span,
        "placed_peak_second": max(per_second.values(), default=0),
        "first_placement_after_queued_s": created[0] - t_queued if created else math.nan,
        "dispatch_p50_s": quantile(dispatch, 0.5),
        "dispatch_p95_s": quantile(dispatch, 0.95),
        "dispatch_p99_s": quantile(dispatch, 0.99),
        "dispatch_max_s": max(dispatch, default=math.nan),
        "makespan_s": (float(finished) - t_submit) if finished is not None else math.nan,
        "rounds": len(rounds),
        "rounds_productive": len(productive),
        "placed_in_rounds": placed,
        "queries_per_placement": sum(r.get("place_q", 0) for r in rounds) / placed if placed else math.nan,
        "queries_per_placement_productive": sum(r.get("place_q", 0) for r in productive) / placed if placed else math.nan,
        "round_queries_per_placement": sum(r["round_q"] for r in rounds) / placed if placed else math.nan,
        "largest_round_placed": max((r["placed"] for r in productive), default=0),
        "queries_largest_round": max(productive, key=lambda r: r["placed"])["place_q"] if productive else 0,
        "queries_fit_fixed": a,
        "queries_fit_per_job": b,
        "empty_round_queries_p50": quantile([r.get("place_q", 0) for r in rounds if not r.get("placed")], 0.5),
        "control_busy_s": sum(r["round_s"] for r in rounds),
    }


# --- the table ---------------------------------------------------------------------------------
def fmt(s: dict, digits: int = 2) -> str:
    if not s or not s.get("n") or math.isnan(s["median"]):
        return "-"
    m = f"{s['median']:.{digits}f}"
    if s["n"] == 1:
        return m
    return f"{m} [{s['min']:.{digits}f}–{s['max']:.{digits}f}]"


def ratio(a: dict, b: dict) -> str:
    if not a or not b or not a.get("n") or not b.get("n") or not b["median"] or math.isnan(a["median"]) or math.isnan(b["median"]):
        return "-"
    r = a["median"] / b["median"]
    return f"{r:.2f}x" if r >= 0.01 else f"{r:.1e}x"


def figures(side: dict | None) -> dict[str, dict]:
    """Each figure of a side as a spread over its samples."""
    if not side or "error" in side:
        return {}
    f: dict[str, dict] = {}
    idle = side.get("idle", {})
    f["tx_node"] = spread([w["tx_per_node_s"] for w in idle.get("fleet_only", [])])
    f["tx_fleet"] = spread([w["tx_per_s"] for w in idle.get("fleet_only", [])])
    f["q_control"] = spread([idle.get("control_statements_per_s")])
    f["idle_steps"] = spread([x for w in idle.get("fleet_only", []) for x in w.get("steps_per_agent_s", [])])
    batches = side.get("batches", [])
    for key in (
        "placed_per_s",
        "placed_peak_second",
        "dispatch_p50_s",
        "dispatch_p95_s",
        "dispatch_p99_s",
        "queries_per_placement",
        "round_queries_per_placement",
        "queries_fit_fixed",
        "queries_fit_per_job",
        "empty_round_queries_p50",
        "makespan_s",
        "first_placement_after_queued_s",
        "failovers",
    ):
        f[key] = spread([b.get(key) for b in batches])
    paced = side.get("paced", [])
    f["paced_rate"] = spread([b.get("paced_rate") for b in paced])
    f["paced_p50"] = spread([b.get("dispatch_p50_s") for b in paced])
    f["paced_p95"] = spread([b.get("dispatch_p95_s") for b in paced])
    f["paced_p99"] = spread([b.get("dispatch_p99_s") for b in paced])
    f["paced_lost"] = spread([len(b.get("nodes_lost", [])) for b in paced])
    lost = side.get("lost", {})
    f["lost"] = spread(lost.get("detected_s", []))
    f["batch_nodes_lost"] = spread([len(b.get("nodes_lost", [])) for b in batches])
    storm = side.get("storm", {})
    f["storm_not_ready"] = spread([len(storm["not_ready"])] if storm else [])
    f["storm_tx_node"] = spread([storm.get("tx_per_node_s")] if storm else [])
    f["load_idle"] = spread([w["loadavg_1m"] for w in idle.get("fleet_only", [])])
    f["busy_idle"] = spread([w["machine_busy_pct"] for w in idle.get("fleet_only", [])])
    f["fleet_cores_idle"] = spread([w["cores_used"].get("node agents") for w in idle.get("fleet_only", [])])
    f["pg_cores_idle"] = spread([w["cores_used"].get("postgres") for w in idle.get("fleet_only", [])])
    f["other_cores_idle"] = spread([w["cores_used"].get("other (incl. other processes on the machine)") for w in idle.get("fleet_only", [])])
    f["load_jobs"] = spread([b["load"]["loadavg_1m"] for b in batches])
    f["busy_jobs"] = spread([b["load"]["machine_busy_pct"] for b in batches])
    for key, part in (
        ("fleet_cores_jobs", "node agents"),
        ("control_cores_jobs", "control worker"),
        ("pg_cores_jobs", "postgres"),
        ("other_cores_jobs", "other (incl. other processes on the machine)"),
    ):
        f[key] = spread([b["load"]["cores_used"].get(part) for b in batches])
    sched = side.get("schedule", [])
    f["steps_per_agent"] = spread([s["steps_per_agent_s"] for s in sched])
    f["ticks_per_agent"] = spread([s["ticks_per_agent_s"] for s in sched])
    f["late_ms"] = spread([s["late_ms_mean"] for s in sched])
    return f


ROWS = [
    # (key, label, digits, target)
    ("tx_node", "DB transactions/s per idle node (control paused)", 3, "<= 0.2"),
    ("tx_fleet", "DB transactions/s, whole idle fleet", 1, ""),
    ("idle_steps", "  legacy schedule then: steps/s per agent (<= 10)", 2, ""),
    ("q_control", "control worker's statements/s at idle", 1, ""),
    ("placed_per_s", "jobs placed/s (first..last attempt)", 1, ">= 100"),
    ("placed_peak_second", "jobs placed in the busiest second", 0, ""),
    ("dispatch_p50_s", "dispatch -> start p50 (s)", 3, ""),
    ("dispatch_p95_s", "dispatch -> start p95 (s)", 3, "<= 1"),
    ("dispatch_p99_s", "dispatch -> start p99 (s)", 3, ""),
    ("paced_rate", "paced arrival: jobs queued per second", 0, ""),
    ("paced_p50", "  paced: dispatch -> start p50 (s)", 3, ""),
    ("paced_p95", "  paced: dispatch -> start p95 (s)", 3, "<= 1"),
    ("paced_p99", "  paced: dispatch -> start p99 (s)", 3, ""),
    ("paced_lost", "  paced: nodes NotReady meanwhile", 0, "0"),
    ("queries_per_placement", "queries per placement (placement, all rounds)", 2, "constant"),
    ("round_queries_per_placement", "queries per placement (whole control rounds)", 2, ""),
    ("queries_fit_fixed", "placement queries per round: fixed part", 1, ""),
    ("queries_fit_per_job", "placement queries per round: per job placed", 2, ""),
    ("empty_round_queries_p50", "queries of a placement that placed nothing", 0, ""),
    ("makespan_s", "batch queued -> all done (s)", 1, ""),
    ("batch_nodes_lost", "nodes NotReady during a batch (heartbeats late)", 0, "0"),
    ("failovers", "failovers in a batch", 0, "0"),
    ("lost", "lost-node detection, silenced -> NotReady (s)", 1, "~ timeout"),
    ("storm_not_ready", "nodes NotReady after a restart storm", 0, "0"),
    ("storm_tx_node", "DB transactions/s per node during the storm", 2, ""),
    ("load_idle", "machine load avg (1 min), idle windows", 2, ""),
    ("busy_idle", "machine CPU busy %, idle windows", 0, ""),
    ("fleet_cores_idle", "fleet process, cores used at idle", 2, ""),
    ("pg_cores_idle", "PostgreSQL (all databases), cores used at idle", 2, ""),
    ("other_cores_idle", "other processes on the machine, cores at idle", 2, ""),
    ("load_jobs", "machine load avg (1 min), job batches", 2, ""),
    ("busy_jobs", "machine CPU busy %, job batches", 0, ""),
    ("fleet_cores_jobs", "fleet process, cores used in the batches", 2, ""),
    ("control_cores_jobs", "control worker, cores used in the batches", 2, ""),
    ("pg_cores_jobs", "PostgreSQL (all databases), cores in the batches", 2, ""),
    ("other_cores_jobs", "other processes, cores in the batches", 2, ""),
    ("steps_per_agent", "legacy schedule: steps/s per agent (at most 10)", 2, ""),
    ("ticks_per_agent", "legacy schedule: ticks/s per agent (at most 2)", 2, ""),
    ("late_ms", "legacy schedule: how late a step ran, mean (ms)", 1, ""),
]


def markdown_table(new: dict | None, base: dict | None) -> str:
    """The same rows as a Markdown table (for docs/benchmarks.md)."""
    fn, fb = figures(new), figures(base)
    out = ["| figure | new | baseline | target | new / baseline |", "| --- | --- | --- | --- | --- |"]
    for key, label, digits, target in ROWS:
        a, b = fn.get(key, {}), fb.get(key, {})
        if a.get("n") or b.get("n"):
            text = label.strip().replace("->", "→").replace("<=", "≤")
            out.append(f"| {text} | {fmt(a, digits)} | {fmt(b, digits)} | {target.replace('<=', '≤').replace('>=', '≥')} | {ratio(a, b)} |")
    return "\n".join(out)


def print_table(new: dict | None, base: dict | None) -> None:
    fn, fb = figures(new), figures(base)
    print()
    for side in (new, base):
        if side:
            if "error" in side:
                print(f"{side['label']}: FAILED: {side['error']}")
            else:
                print(
                    f"{side['label']}: {side['nodes']} nodes x {side['gpus'] // max(1, side['nodes'])} GPUs = {side['gpus']} GPUs, "
                    f"{side['jobs']} jobs in {len(side.get('batches', []))} batches; {side['fleet']}; "
                    f"runs {side['run_seconds']:g}s; NODE_HEARTBEAT_TIMEOUT {side['heartbeat_timeout_s']:g}s"
                )
    print("values: median [min–max] over the samples (idle windows, batches, silenced nodes, stats lines)")
    print(f"{'figure':<54}{'new':>24}{'baseline':>24}{'target':>10}{'new/base':>10}")
    for key, label, digits, target in ROWS:
        a, b = fn.get(key, {}), fb.get(key, {})
        if not (a.get("n") or b.get("n")):
            continue
        print(f"{label:<54}{fmt(a, digits):>24}{fmt(b, digits):>24}{target:>10}{ratio(a, b):>10}")
    for side in (new, base):
        if side and "lost" in side:
            lost = side["lost"]
            if lost.get("undetected") or lost.get("other_nodes_not_ready"):
                print(f"{side['label']}: lost nodes undetected {lost['undetected']}, other nodes NotReady {lost['other_nodes_not_ready']}")
        if side and side.get("storm") and not side["storm"]["fleet_alive"]:
            print(f"{side['label']}: the fleet process exited during the storm")
