"""CPU seconds spent by each part of the cluster between two snapshots (psutil)."""

from __future__ import annotations

import os

import psutil


def proc_cpu(pid: int, *, children: bool) -> tuple[float, float]:
    """(own CPU seconds, CPU seconds of reaped descendants) of a process and, if asked, of its
    live child processes (a Celery worker's embedded beat)."""
    try:
        p = psutil.Process(pid)
        t = p.cpu_times()
        own, reaped = t.user + t.system, t.children_user + t.children_system
        if children:
            for c in p.children(recursive=False):
                try:
                    ct = c.cpu_times()
                    if "agent.runner" not in " ".join(c.cmdline()):
                        own += ct.user + ct.system
                except psutil.Error:
                    pass
        return own, reaped
    except psutil.Error:
        return 0.0, 0.0


def by_name(name: str) -> dict[int, float]:
    out = {}
    for p in psutil.process_iter(["name", "cpu_times"]):
        if p.info["name"] and p.info["name"].startswith(name) and p.info["cpu_times"]:
            t = p.info["cpu_times"]
            out[p.pid] = t.user + t.system
    return out


class Snapshot:
    def __init__(self, control: list[int], agents: list[int]) -> None:
        sys_t = psutil.cpu_times()
        self.busy = sum(sys_t) - sys_t.idle - getattr(sys_t, "iowait", 0.0)
        self.total = sum(sys_t)
        self.control = sum(proc_cpu(p, children=True)[0] for p in control)
        agent = [proc_cpu(p, children=False) for p in agents]
        self.agents = sum(a for a, _ in agent)
        self.runs = sum(r for _, r in agent)  # runners and the jobs they ran, once reaped
        self.postgres = by_name("postgres")
        self.redis = by_name("redis-server")
        t = psutil.Process(os.getpid()).cpu_times()
        self.bench = t.user + t.system


def delta(a: Snapshot, b: Snapshot) -> dict[str, float]:
    def named(x: dict[int, float], y: dict[int, float]) -> float:
        return sum(v - x.get(pid, 0.0) for pid, v in y.items())

    parts = {
        "control worker": b.control - a.control,
        "node agents": b.agents - a.agents,
        "runners + jobs": b.runs - a.runs,
        "postgres": named(a.postgres, b.postgres),
        "redis": named(a.redis, b.redis),
        "bench (monitor)": b.bench - a.bench,
    }
    busy = b.busy - a.busy
    parts["other (incl. other processes on the machine)"] = max(0.0, busy - sum(parts.values()))
    wall_cores = b.total - a.total  # CPU-seconds available (all cores) in the interval
    return {"busy": busy, "available": wall_cores, "parts": parts}
