"""``python -m bench.failover --checkpointless``: today's failover (resume from the last disk
checkpoint) beside checkpointless failover (resume from the newest in-memory replica held on
another node), in one run of one embedded console, on ``jobs.examples.train_ckpt`` (ckptlib's
plain API: a save every ``--save-every`` steps, a snapshot every step when the job has it on).

1. Latency: one job per mode, ``--faults`` hardware faults (Xid 79) each, one after another; each
   lands a random number of steps after the previous resume (anywhere in the save cycle). Per
   fault: the steps lost (the last step the killed run printed minus the step the new attempt
   resumed from) and the time from the fault to the new attempt's first training step line.
2. Step cost, with a core free (``bench.failover.stepcost``): one fault-free job at a time, on
   one torch thread, alternating windows without and with replicas; the target's figure.
3. Goodput: four jobs side by side for ``--goodput-minutes``: a fault-free one without replicas
   (the baseline), a fault-free one with them (the replication's cost on the step time), and one
   per mode with a fault every ``--fault-every`` minutes. Goodput = a faulted job's steps over the
   baseline's in the same window (its own start-up included in both). The fault-free pair's step
   times are printed too: the cost with four jobs on the two cores, no core free.

Torch runs one thread per job (``--train-threads``): in the step-cost windows, one job at a time,
the other core is free for the replication.
"""

from __future__ import annotations

import random
import sys
import time

from bench.failover import stepcost
from bench.failover.console import EmbeddedConsole
from bench.failover.goodput import GoodputRun, fault_offsets, fault_once, finish, train_command, train_env
from bench.failover.stats import median, p95
from bench.failover.timeline import Failover, first_step, last_step, wait_for

MODES = (("disk", False), ("checkpointless", True))
TARGET_LOST_MAX = 1
TARGET_FIRST_STEP_P95_S = 1.0
TARGET_GOODPUT = 0.995
TARGET_STEP_COST = 0.03


def create(console: EmbeddedConsole, name: str, *, checkpointless: bool, args):
    return console.create_job(
        name,
        train_command(sleep=args.train_sleep, save_every=args.save_every),
        env=train_env(args.train_threads),
        checkpointless=checkpointless,
    )


def running_attempt(job_id: int) -> int:
    from jobs.models import JobAttempt

    return JobAttempt.objects.filter(job_id=job_id, state=JobAttempt.State.RUNNING).order_by("-number").values_list("number", flat=True).first() or 0


def latency_series(console: EmbeddedConsole, label: str, *, checkpointless: bool, args, rng: random.Random, log=print) -> list[Failover]:
    job = create(console, f"latency-{label}", checkpointless=checkpointless, args=args)
    t0 = job.created_at.timestamp()
    samples: list[Failover] = []
    for _ in range(args.faults):
        number = wait_for(lambda: running_attempt(job.pk), timeout=args.timeout, what="a running attempt")
        start = wait_for(lambda n=number: first_step(job.pk, attempt=n), timeout=args.timeout, what="its first step")
        ahead = rng.randint(3, args.save_every + 3)  # anywhere in the save cycle
        wait_for(
            lambda n=number, s=start[0] + ahead: (last_step(job.pk, attempt=n) or (0, 0.0))[0] >= s,
            timeout=args.timeout,
            what=f"step {start[0] + ahead}",
        )
        try:
            samples.append(fault_once(console, job.pk, timeout=args.timeout, log=log, t0=t0))
        except TimeoutError as exc:
            log(f"  fault FAILED: {exc}")
    console.stop_job(job)
    return samples


def goodput_runs(console: EmbeddedConsole, args, log=print) -> dict[str, GoodputRun]:
    window = args.goodput_minutes * 60.0
    jobs = {
        "baseline": create(console, "goodput-baseline", checkpointless=False, args=args),
        "baseline+replicas": create(console, "goodput-baseline-replicas", checkpointless=True, args=args),
        "disk": create(console, "goodput-disk", checkpointless=False, args=args),
        "checkpointless": create(console, "goodput-checkpointless", checkpointless=True, args=args),
    }
    runs = {name: GoodputRun(job_id=job.pk, label=name, t0=job.created_at.timestamp(), window_s=window) for name, job in jobs.items()}
    t0 = min(run.t0 for run in runs.values())
    log(
        f"  4 jobs side by side for {args.goodput_minutes:g} min; faults at +{', +'.join(f'{o:.0f}s' for o in fault_offsets(args.goodput_minutes, args.fault_every))}"
    )
    for offset in fault_offsets(args.goodput_minutes, args.fault_every):
        delay = t0 + offset - time.time()
        if delay > 0:
            time.sleep(delay)
        for name in ("disk", "checkpointless"):
            runs[name].failovers.append(fault_once(console, runs[name].job_id, timeout=args.timeout, log=log, t0=runs[name].t0))
    for run in runs.values():
        finish(run, interval=console.interval)
    for job in jobs.values():
        console.stop_job(job)
    return runs


def row(label: str, values: list[str]) -> str:
    return f"  {label:<44}" + "".join(f"{v:>22}" for v in values)


def report(latency: dict[str, list[Failover]], runs: dict[str, GoodputRun] | None, out: dict, cost: dict | None = None) -> tuple[bool, list[str]]:
    lines = ["Checkpointless failover beside today's (jobs.examples.train_ckpt):", row("", [name for name, _ in MODES])]
    figures: dict[str, dict] = {}
    for name, _ in MODES:
        samples = latency.get(name, [])
        lost = [fo.extra["steps_lost"] for fo in samples if fo.extra.get("steps_lost") is not None]
        first = [fo.extra["fault_to_first_step_s"] for fo in samples if fo.extra.get("fault_to_first_step_s") is not None]
        sources = [fo.extra.get("resume_source", "") for fo in samples]
        figures[name] = {
            "faults": len(samples),
            "steps_lost": lost,
            "first_step_s": first,
            "from_replica": sum(1 for s in sources if s == "replica"),
        }
    lines.append(row("faults measured", [str(figures[n]["faults"]) for n, _ in MODES]))
    lines.append(
        row(
            "steps lost per fault: median, max",
            [f"{median(f['steps_lost']):.0f}, {max(f['steps_lost'])}" if f["steps_lost"] else "-" for f in figures.values()],
        )
    )
    lines.append(
        row(
            "fault → first new training step: median, p95",
            [f"{median(f['first_step_s']):.2f} s, {p95(f['first_step_s']):.2f} s" if f["first_step_s"] else "-" for f in figures.values()],
        )
    )
    lines.append(row("attempts resumed from a replica", [str(f["from_replica"]) for f in figures.values()]))
    ok = True
    cp = figures["checkpointless"]
    if cp["steps_lost"]:
        met = max(cp["steps_lost"]) <= TARGET_LOST_MAX
        ok &= met
        lines.append(f"  target steps lost ≤ {TARGET_LOST_MAX} (max): {max(cp['steps_lost'])}  {'PASS' if met else 'FAIL'}")
    if cp["first_step_s"]:
        met = p95(cp["first_step_s"]) <= TARGET_FIRST_STEP_P95_S
        ok &= met
        lines.append(f"  target first new step p95 ≤ {TARGET_FIRST_STEP_P95_S:g} s: {p95(cp['first_step_s']):.2f} s  {'PASS' if met else 'FAIL'}")
    if runs:
        base = runs["baseline"]
        goodput = {name: (runs[name].steps or 0) / base.steps if base.steps else 0.0 for name, _ in MODES}
        lines.append(row(f"goodput ({len(runs['disk'].failovers)} faults in {base.window_s / 60:g} min)", [f"{goodput[n]:.2%}" for n, _ in MODES]))
        with_replicas, without = runs["baseline+replicas"].steady_step_s, base.steady_step_s
        crowded = (with_replicas / without - 1.0) if with_replicas and without else float("nan")
        lines.append(
            f"  replication's cost on the step time, 4 jobs on the cores (no core free): {without * 1000:.1f} → {with_replicas * 1000:.1f} ms/step = {crowded:+.1%}"
            if with_replicas and without
            else "  replication's cost with 4 jobs: not measured"
        )
        met = goodput["checkpointless"] >= TARGET_GOODPUT
        ok &= met
        lines.append(f"  target goodput ≥ {TARGET_GOODPUT:.1%}: {goodput['checkpointless']:.2%}  {'PASS' if met else 'FAIL'}")
        out["step_cost_crowded"] = crowded
        out["goodput"] = {
            name: {"job": run.job_id, "steps": run.steps, "steady_step_s": run.steady_step_s, "faults": len(run.failovers)} for name, run in runs.items()
        }
        out["goodput_ratio"] = goodput
    if cost:
        lines.append(f"  step time alone, without replicas: {stepcost.spread(cost['without'])}")
        lines.append(f"  step time alone, with replicas:    {stepcost.spread(cost['with'])}")
        met = cost["cost"] <= TARGET_STEP_COST
        ok &= met
        lines.append(f"  target step-time cost ≤ {TARGET_STEP_COST:.0%} (a core free): {cost['cost']:+.1%}  {'PASS' if met else 'FAIL'}")
        out["step_cost"] = cost
    out["latency"] = {name: {**figures[name], "runs": [fo.to_dict() for fo in latency.get(name, [])]} for name, _ in MODES}
    return ok, lines


def note_sources(samples: list[Failover]) -> None:
    from jobs.models import JobAttempt

    for fo in samples:
        new = JobAttempt.objects.filter(job_id=fo.job_id, number=fo.old_attempt + 1).values_list("resume_source", "resume_detail").first()
        if new:
            fo.extra["resume_source"], fo.extra["resume_detail"] = new


def run(console: EmbeddedConsole, args, out: dict) -> tuple[bool, list[str]]:
    rng = random.Random(args.seed)
    latency: dict[str, list[Failover]] = {}
    for name, on in () if args.skip_latency else MODES:
        print(f"Latency ({name}): {args.faults} faults …", flush=True)
        latency[name] = latency_series(console, name, checkpointless=on, args=args, rng=rng)
        note_sources(latency[name])
    cost = None
    if not args.skip_cost:
        print("Step cost, one job at a time:", flush=True)
        cost = stepcost.measure(console, args)
    runs = None
    if not args.skip_goodput:
        print(f"Goodput: {args.goodput_minutes:g} min, a fault every {args.fault_every:g} min …", flush=True)
        runs = goodput_runs(console, args)
    ok, lines = report(latency, runs, out, cost)
    print("\n".join(lines), flush=True)
    sys.stdout.flush()
    return ok, lines
