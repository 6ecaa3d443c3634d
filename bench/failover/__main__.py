"""``python -m bench.failover [--quick] [--runs N] [--goodput-minutes D] [--fault-every F] ...``

Measures Job Failover in an embedded console of its own (see ``bench/failover/__init__.py``) and
prints median/p95 per phase, goodput, and PASS/FAIL against the targets:

* p95 fault → ``Running`` on a new node ≤ 5 s; detection ≤ 2 s after the process died (p95);
* goodput with a hardware fault every F minutes ≥ 95 % of the fault-free steps per hour;
* a hung rank (no output, SIGTERM ignored) on a GPU that falls off the bus: every process of it
  gone ≤ 2 s after the fault (the health monitor's thread), then failed over.

Exit status: 0 all targets met, 1 a target missed, 2 the bench itself could not complete.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import sys
import time
from importlib import metadata
from pathlib import Path

from bench.failover.console import EmbeddedConsole, configure_environment, make_var_dir
from bench.failover.stats import median, p95, table

TARGET_RUNNING_P95_S = 5.0
TARGET_DETECTION_S = 2.0
TARGET_GOODPUT = 0.95
TARGET_HUNG_S = 2.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.failover", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: 3 latency runs, 1-minute goodput with a fault at 30 s")
    p.add_argument("--runs", type=int, default=None, help="latency runs (default 20; 3 with --quick)")
    p.add_argument(
        "--workload",
        choices=["print", "train"],
        default="print",
        help="latency job: 'print' a stdlib loop printing a line every --line-every s (default), 'train' jobs.examples.train_ckpt",
    )
    p.add_argument(
        "--die-first",
        action="store_true",
        help="latency: the bench kills the run's processes itself just before injecting the fault, so detection is "
        "measured for a process that dies on its own (default: the agent kills it when it applies the fault)",
    )
    p.add_argument("--line-every", type=float, default=0.05, help="latency job: seconds between lines (default 0.05)")
    p.add_argument("--goodput-minutes", type=float, default=None, help="goodput window D in minutes (default 6; 1 with --quick)")
    p.add_argument("--fault-every", type=float, default=None, help="one hardware fault every F minutes (default 2; 1 with --quick)")
    p.add_argument("--train-sleep", type=float, default=0.05, help="train_ckpt --sleep: seconds slept per step (default 0.05)")
    p.add_argument("--save-every", type=int, default=20, help="train_ckpt --save-every: steps between checkpoints (default 20)")
    p.add_argument(
        "--train-threads",
        type=int,
        default=1,
        help="OMP_NUM_THREADS in the training jobs' env (default 1, so two CPU runs side by side do not fight; 0: torch default)",
    )
    p.add_argument("--sequential", action="store_true", help="run the fault-free baseline before the faulted run (default: side by side)")
    p.add_argument("--poll-interval", type=float, default=None, help="set AGENT_POLL_INTERVAL (default: the settings' value, 0.5)")
    p.add_argument("--health-interval", type=float, default=None, help="set HEALTH_CHECK_INTERVAL (default: the settings' value, 5)")
    p.add_argument("--skip-latency", action="store_true")
    p.add_argument("--skip-goodput", action="store_true")
    p.add_argument("--hung-runs", type=int, default=None, help="hung-rank detection runs (default 5; 2 with --quick)")
    p.add_argument("--skip-hung", action="store_true")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for any one failover")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", type=Path, default=None, help="also write all samples and figures to this file")
    p.add_argument("--keep", action="store_true", help="keep the temporary console directory")
    p.add_argument(
        "--backend",
        choices=["agents", "slurm", "both"],
        default="agents",
        help="where the runs run: the console's own agents (default), a one-host Slurm cluster (root, slurm-wlm, munge), "
        "or both, one after the other in this run, their latency side by side (Slurm: latency only)",
    )
    p.add_argument(
        "--checkpointless",
        action="store_true",
        help="today's failover (disk checkpoint) beside checkpointless failover (in-memory replicas): steps lost, fault → first new "
        "step, goodput and the replication's step-time cost (bench/failover/checkpointless.py); the other parts are skipped",
    )
    p.add_argument("--faults", type=int, default=None, help="--checkpointless: faults per mode for the latency figures (default 20; 4 with --quick)")
    p.add_argument("--cost-pairs", type=int, default=None, help="--checkpointless: pairs of step-cost windows, one job at a time (default 3; 1 with --quick)")
    p.add_argument("--cost-window", type=float, default=40.0, help="--checkpointless: seconds of each step-cost window (default 40)")
    p.add_argument("--skip-cost", action="store_true", help="--checkpointless: no step-cost windows")
    p.add_argument("--verbose", action="store_true", help="show the console's own log (LOG_LEVEL=INFO unless set)")
    args = p.parse_args(argv)
    args.cost_pairs = args.cost_pairs if args.cost_pairs is not None else (1 if args.quick else 3)
    args.runs = args.runs if args.runs is not None else (3 if args.quick else 20)
    args.hung_runs = args.hung_runs if args.hung_runs is not None else (2 if args.quick else 5)
    args.faults = args.faults if args.faults is not None else (4 if args.quick else 20)
    longer = 10.0 if args.checkpointless else 6.0  # the window: a fault every 2 minutes for 10 minutes
    args.goodput_minutes = (
        args.goodput_minutes if args.goodput_minutes is not None else (2.0 if args.quick and args.checkpointless else 1.0 if args.quick else longer)
    )
    args.fault_every = args.fault_every if args.fault_every is not None else (1.0 if args.quick else 2.0)
    return args


def machine_lines(var_dir: Path) -> list[str]:
    from django.conf import settings

    cpu = ""
    with contextlib.suppress(OSError):
        cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name")), "")
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        mem = next(int(ln.split()[1]) // 1024 // 1024 for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal"))
    except (OSError, StopIteration):
        mem = "?"

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "-"

    return [
        f"machine : {platform.node()}  {usable} usable of {os.cpu_count()} cores  {cpu or platform.processor()}  {mem} GiB RAM",
        f"software: Python {platform.python_version()}  Django {version('django')}  torch {version('torch')}  {platform.platform()}",
        f"settings: AGENT_POLL_INTERVAL={settings.AGENT_POLL_INTERVAL}  HEALTH_CHECK_INTERVAL={settings.HEALTH_CHECK_INTERVAL}  "
        f"HEALTH_MONITOR_INTERVAL={settings.HEALTH_MONITOR_INTERVAL}  "
        f"STOP_GRACE_PERIOD={settings.STOP_GRACE_PERIOD}  MAX_FAILOVERS={settings.MAX_FAILOVERS}  FAILOVER_EXCLUDE={settings.FAILOVER_EXCLUDE}  "
        f"nodes={settings.SIMULATED_NODES}×{settings.SIMULATED_GPUS_PER_NODE} simulated GPUs",
        f"console : {var_dir} (SQLite WAL {settings.DATABASES['default']['NAME']})",
        load_line("load at start"),
    ]


def load_line(label: str) -> str:
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return f"{label}: unknown"
    return f"{label}: load average {one:.2f} {five:.2f} {fifteen:.2f} (1/5/15 min) — other work on the machine skews the figures"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def latency_report(samples, args, out: dict) -> tuple[bool, list[str]]:
    lines = []
    if not samples:
        return False, ["latency: no successful run"]
    names = list(samples[0].phases())
    rows = [(name, [s.phases()[name] for s in samples]) for name in names]
    lines.append(table(rows, title=f"Failover latency, {len(samples)} runs (workload '{args.workload}'), seconds:"))
    by = dict(rows)
    running_p95 = p95(by["TOTAL fault → Running"])
    detection = by.get("detection from a process that died itself (kill → ended)") or by["detection (process died → attempt ended)"]
    detection_p95, detection_max = p95(detection), max(detection)
    non_hw = [s for s in samples if s.verdict != "hardware"]
    ok_running = running_p95 <= TARGET_RUNNING_P95_S
    ok_detect = detection_p95 <= TARGET_DETECTION_S
    if len(samples) > 1:
        first, rest = samples[0].phases(), [s.phases() for s in samples[1:]]
        lines.append(
            f"  first failover of this console process: fault → Running {first['TOTAL fault → Running']:.3f} s "
            f"(launch {first['launch (placed → Running)']:.3f} s); the other {len(rest)}: median "
            f"{median([r['TOTAL fault → Running'] for r in rest]):.3f} s, max {max(r['TOTAL fault → Running'] for r in rest):.3f} s "
            f"(launch median {median([r['launch (placed → Running)'] for r in rest]):.3f} s)"
        )
    lines.append(f"  target fault → Running p95 ≤ {TARGET_RUNNING_P95_S:g} s: {running_p95:.3f} s  {verdict(ok_running)}")
    lines.append(
        f"  target detection ≤ {TARGET_DETECTION_S:g} s after the process died: p95 {detection_p95:.3f} s, max {detection_max:.3f} s  {verdict(ok_detect)}"
    )
    if non_hw:
        lines.append(f"  WARNING: {len(non_hw)} run(s) were not judged a hardware fault")
    out["latency"] = {
        "runs": [s.to_dict() for s in samples],
        "summary": {name: {"median": median(v), "p95": p95(v)} for name, v in rows},
        "targets": {"running_p95_s": running_p95, "running_ok": ok_running, "detection_p95_s": detection_p95, "detection_ok": ok_detect},
    }
    return ok_running and ok_detect, lines


def side_by_side(by_backend: dict[str, list]) -> list[str]:
    """The same failover measured on each backend in this run: medians and p95s, and Slurm's
    figure as a ratio of the agents'."""
    names = ["TOTAL fault → Running", "TOTAL fault → first new line (ts)", "launch (placed → Running)", "detection (process died → attempt ended)"]
    lines = [
        "Failover on each backend, this run (seconds; the first new line is the new run's first step's line):",
        f"  {'phase':<42} {'agents median':>13} {'p95':>7} {'slurm median':>13} {'p95':>7} {'slurm/agents (median)':>22}",
    ]
    for name in names:
        a = [s.phases()[name] for s in by_backend["agents"] if s.phases()[name] is not None]
        b = [s.phases()[name] for s in by_backend["slurm"] if s.phases()[name] is not None]
        if not a or not b:
            continue
        ratio = median(b) / median(a) if median(a) else float("nan")
        lines.append(f"  {name:<42} {median(a):>13.3f} {p95(a):>7.3f} {median(b):>13.3f} {p95(b):>7.3f} {ratio:>21.2f}×")
    return lines


def goodput_report(baseline, faulted, args, out: dict) -> tuple[bool, list[str]]:
    lines = [
        f"Goodput, jobs.examples.train_ckpt --sleep {args.train_sleep} --save-every {args.save_every} (OMP_NUM_THREADS={args.train_threads or 'default'}), "
        f"{args.goodput_minutes:g}-minute window from submission, a fault every {args.fault_every:g} min "
        f"({'sequential' if args.sequential else 'side by side'}):"
    ]
    for run in (baseline, faulted):
        step_s = run.steady_step_s
        lines.append(
            f"  {run.label:<9} job {run.job_id}: step {run.steps} reached → {run.steps_per_hour:,.0f} steps/h"
            f"  ({len(run.failovers)} faults; {step_s * 1000 if step_s else float('nan'):.1f} ms/step after start-up)"
        )
    ratio = faulted.steps / baseline.steps if baseline.steps else 0.0
    ok = ratio >= TARGET_GOODPUT
    n = len(faulted.failovers)
    lines.append(
        f"  goodput = {faulted.steps_per_hour:,.0f} / {baseline.steps_per_hour:,.0f} steps/h = {ratio:.2%}  (target ≥ {TARGET_GOODPUT:.0%})  {verdict(ok)}"
    )
    fo_rows = []
    if n:
        lost = [fo.extra.get("steps_lost") for fo in faulted.failovers]
        down = [fo.extra.get("downtime_s") for fo in faulted.failovers]
        step_s = baseline.steady_step_s or float("nan")
        deficit = (baseline.steps - faulted.steps) / n
        lines.append(
            f"  per fault: steps redone (last printed − resume step) median {median(lost):.0f}, "
            f"gap between step lines median {median(down):.2f} s; deficit vs baseline {deficit:.0f} steps "
            f"≈ {deficit * step_s:.2f} s of training per fault"
        )
        per_hour = 60.0 / args.fault_every
        est = 1.0 - per_hour * deficit * step_s / 3600.0
        lines.append(f"  at {per_hour:g} faults/h that deficit gives {est:.2%} over an hour (window start-up excluded)")
        if args.fault_every != 2.0:
            lines.append(f"  at the issue's rate (a fault every 2 min, 30/h) it gives {1.0 - 30 * deficit * step_s / 3600.0:.2%}")
        names = list(faulted.failovers[0].phases())
        fo_rows = [(name, [fo.phases()[name] for fo in faulted.failovers]) for name in names]
        fo_rows.append(("fault → first step line (ts)", [fo.extra.get("fault_to_first_step_s") for fo in faulted.failovers]))
        lines.append(table(fo_rows, title=f"Failover phases of the {n} training-job faults, seconds:"))
    out["goodput"] = {
        "baseline": {"job": baseline.job_id, "steps": baseline.steps, "steps_per_hour": baseline.steps_per_hour, "steady_step_s": baseline.steady_step_s},
        "faulted": {
            "job": faulted.job_id,
            "steps": faulted.steps,
            "steps_per_hour": faulted.steps_per_hour,
            "failovers": [fo.to_dict() for fo in faulted.failovers],
        },
        "ratio": ratio,
        "ok": ok,
    }
    return ok, lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    var_dir = make_var_dir(args.keep)
    configure_environment(var_dir=var_dir, poll_interval=args.poll_interval, health_interval=args.health_interval, verbose=args.verbose)
    console = EmbeddedConsole(var_dir)
    out: dict = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    results: list[bool] = []
    report: list[str] = []
    status = 0
    began = time.monotonic()
    cluster = None
    try:
        console.start()
        from django.conf import settings

        from bench.failover.goodput import fault_offsets

        faults = len(fault_offsets(args.goodput_minutes, args.fault_every))
        if not args.skip_goodput and faults > settings.MAX_FAILOVERS:
            # The window holds more faults than the failover limit: raise it for this bench only.
            settings.MAX_FAILOVERS = faults
        header = machine_lines(var_dir)
        out["machine"] = header
        print("\n".join(header))
        print(flush=True)
        if args.checkpointless:
            from bench.failover import checkpointless

            settings.MAX_FAILOVERS = 1_000_000  # every fault of a series fails over (the bench only)
            ok, lines = checkpointless.run(console, args, out)
            results.append(ok)
            args.skip_latency = args.skip_hung = args.skip_goodput = True

        if args.backend != "agents":
            from jobs.backends.slurm.cluster import LocalSlurmCluster

            # Configured as GPU sites run Slurm (docs/slurm-site.md): jobs run as its service account.
            cluster = LocalSlurmCluster(var_dir / "slurm", nodes=[f"node-{chr(ord('a') + n)}" for n in range(settings.SIMULATED_NODES)],
                                        gpus=settings.SIMULATED_GPUS_PER_NODE, site=True)  # fmt: skip
            cluster.start()
        by_backend: dict[str, list] = {}
        for backend in ["agents", "slurm"] if args.backend == "both" else [args.backend]:
            if args.skip_latency:
                break
            from bench.failover.latency import run_latency

            if backend == "slurm":
                console.use_backend("slurm", cluster)
            print(f"Latency ({backend}): {args.runs} runs …", flush=True)
            samples = run_latency(
                console, runs=args.runs, workload=args.workload, every=args.line_every, seed=args.seed, timeout=args.timeout,
                die_first=args.die_first, prefix=f"latency-{backend}",
            )  # fmt: skip
            if len(samples) < args.runs:
                status = 2
            by_backend[backend] = samples
            ok, lines = latency_report(samples, args, out.setdefault(backend, {}) if args.backend == "both" else out)
            results.append(ok)
            lines = [f"[{backend}] " + lines[0], *lines[1:]]
            report += [*lines, ""]
            print("\n".join(lines), flush=True)
            print()
        if "slurm" in by_backend:
            from bench.failover.bare import bare_sbatch

            bare = bare_sbatch(cluster, args.runs, var_dir / "bare-sbatch")
            launch = [s.phases()["launch (placed → Running)"] for s in by_backend["slurm"] if s.phases()["launch (placed → Running)"] is not None]
            over = median(launch) - median(bare) if launch else float("nan")
            lines = [
                f"Slurm's own launch, this run: bare sbatch (1 GPU, no container) → first line, {len(bare)} jobs: "
                f"median {median(bare):.3f} s, p95 {p95(bare):.3f} s, min {min(bare):.3f}, max {max(bare):.3f}",
                f"  the console's placed → Running on Slurm: median {median(launch) if launch else float('nan'):.3f} s, "
                f"{over:+.3f} s over the bare sbatch (target ≤ +1 s: {'met' if over <= 1 else 'NOT met'})",
            ]
            out.setdefault("slurm_bare", {"seconds": bare, "launch_over_bare_median_s": over})
            report += [*lines, ""]
            print("\n".join(lines), flush=True)
            print()
        if len(by_backend) == 2:
            lines = side_by_side(by_backend)
            report += [*lines, ""]
            print("\n".join(lines), flush=True)
            print()
        if args.backend == "slurm":
            args.skip_hung = args.skip_goodput = True
        elif args.backend == "both":
            console.use_backend("agents")

        if not args.skip_hung:
            from bench.failover.hung import hung_report, run_hung

            print(f"Hung rank: {args.hung_runs} runs …", flush=True)
            ok, lines = hung_report(run_hung(console, runs=args.hung_runs, timeout=args.timeout), TARGET_HUNG_S, out)
            results.append(ok)
            report += [*lines, ""]
            print("\n".join(lines), flush=True)
            print()

        if not args.skip_goodput:
            from bench.failover.goodput import run_goodput

            print(f"Goodput: {args.goodput_minutes:g} min, a fault every {args.fault_every:g} min …", flush=True)
            baseline, faulted = run_goodput(
                console,
                minutes=args.goodput_minutes,
                fault_every=args.fault_every,
                sleep=args.train_sleep,
                save_every=args.save_every,
                sequential=args.sequential,
                timeout=args.timeout,
                threads=args.train_threads,
            )
            ok, lines = goodput_report(baseline, faulted, args, out)
            results.append(ok)
            report += lines
            print("\n".join(lines), flush=True)
    except Exception as exc:
        import traceback

        traceback.print_exc()
        print(f"bench failed: {exc}", file=sys.stderr)
        status = 2
    finally:
        console.shutdown()
        if cluster is not None:
            cluster.stop()
        print(load_line("load at end"))
        if args.json:
            args.json.write_text(json.dumps(out, indent=2, default=str))
        if args.keep:
            print(f"console directory kept: {var_dir}")
        else:
            shutil.rmtree(var_dir, ignore_errors=True)
    print(
        f"\nbench took {time.monotonic() - began:.0f} s; overall: "
        + ("PASS" if results and all(results) and status == 0 else "FAIL" if results else "no result")
    )
    if status:
        return status
    return 0 if results and all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
