"""The replication's cost on the step time with a core free for it (``--checkpointless``).

One fault-free ``jobs.examples.train_ckpt`` job at a time, on one torch thread, so the machine's
other core is free for what replication adds (ckptlib's snapshot writer, the node agent's copy to
another node's memory): ``--cost-pairs`` pairs of windows, in each pair a job without replicas
and one with them (which first alternates: a shared machine's drift falls on both). Each window
starts a fresh job, waits ``WARM_UP_S`` past its first step line, then counts its steps over
``--cost-window`` seconds from the run's own line timestamps. The cost is the median step time
with replicas over the median without."""

from __future__ import annotations

import time

from bench.failover.console import EmbeddedConsole
from bench.failover.goodput import train_command, train_env
from bench.failover.stats import median
from bench.failover.timeline import first_step, last_step, wait_for

WARM_UP_S = 5.0


def window(console: EmbeddedConsole, label: str, *, checkpointless: bool, seconds: float, args) -> float:
    """Seconds per step of one fresh job over ``seconds`` of its steady run."""
    job = console.create_job(
        f"step-cost-{label}",
        train_command(sleep=args.train_sleep, save_every=args.save_every),
        env=train_env(args.train_threads),
        checkpointless=checkpointless,
    )
    try:
        start = wait_for(lambda: first_step(job.pk, attempt=1), timeout=args.timeout, what=f"{label}'s first step")
        begin = start[1] + WARM_UP_S
        end = begin + seconds
        time.sleep(max(0.0, end - time.time()) + 3 * console.interval + 1.0)  # the window, then its lines' ingestion
        first, last = last_step(job.pk, until=begin), last_step(job.pk, until=end)
        if first is None or last is None or last[0] <= first[0]:
            raise TimeoutError(f"{label}: no steps within its window")
        return (last[1] - first[1]) / (last[0] - first[0])
    finally:
        console.stop_job(job)


def measure(console: EmbeddedConsole, args, log=print) -> dict:
    """``{"without": [s/step per window], "with": [...], "cost": median ratio - 1}``."""
    seconds = args.cost_window
    samples: dict[str, list[float]] = {"without": [], "with": []}
    log(f"  {args.cost_pairs} pairs of {seconds:g} s windows, one job at a time ({args.train_threads} torch thread) …")
    for pair in range(args.cost_pairs):
        order = (("without", False), ("with", True)) if pair % 2 == 0 else (("with", True), ("without", False))
        for name, on in order:
            step_s = window(console, f"{name}-{pair + 1}", checkpointless=on, seconds=seconds, args=args)
            samples[name].append(step_s)
            log(f"    pair {pair + 1} {name:>7} replicas: {step_s * 1000:.2f} ms/step")
    without, with_replicas = median(samples["without"]), median(samples["with"])
    return {**samples, "median_without": without, "median_with": with_replicas, "cost": with_replicas / without - 1.0}


def spread(values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    return f"{median(ms):.2f} ms (min {ms[0]:.2f}, max {ms[-1]:.2f}, n={len(ms)})"
