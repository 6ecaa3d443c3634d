"""Today's node agents as a simulated fleet, for the baseline of ``bench.scale.fleetbench``:

    python -m bench.scale.legacy_fleet --nodes N --gpus 8 --prefix fleet- --run-seconds S [--silence-file PATH]

The command line of ``bench.scale.fleet`` (the event-driven fleet), for the code of commit
42b1241: run it with the working directory in a tree of that commit (``bench.scale.fleetbench``
makes one, with the current ``bench/scale`` copied in). It hosts N of that code's
``agent.node_agent.NodeAgent`` objects in this one process, one per node as ``manage.py nodeagent``
makes them (registered with ``register_nodes``, the address set, ``stop_strays`` at start), and
drives each on that code's schedule, the one of ``agent.loop.EmbeddedControlLoop(control=False)``:
a full ``tick()`` every AGENT_POLL_INTERVAL (0.5 s), ``collect()`` every OUTPUT_POLL_INTERVAL
(0.1 s) in between, each step followed by ``close_old_connections()``. The failover plug-in's
health monitor is not started as a thread: its ``on_round`` then polls it on every tick, which is
the monitor thread's own rate (HEALTH_MONITOR_INTERVAL, 0.5 s) — what that code does for a
round-driven agent.

Not a thread per agent: that would hold two PostgreSQL connections per agent (the loop's and the
monitor's) and the server allows 100. A few scheduler threads (``--threads``, 8) serve the agents
in turn instead, each step at its due time (the agent's next step is due OUTPUT_POLL_INTERVAL after
its last step ended, as in the loop). Where the machine cannot keep up, steps run late and the
agents poll less often than that code would: the ``stats`` lines this process prints (steps and
ticks per agent per second, and how late steps ran) say by how much.

Only the OS process of a run is simulated: ``agent.launch`` starts its supervisor with
``subprocess.Popen``; here that name, in that module only, makes a simulated runner which writes
what ``agent.runner`` writes (``agent.runfiles``, copied into that tree by the benchmark, where
the files have the same names and fields) — its pid record (without a process group, so nothing
is ever signalled), one line of output, and after S seconds its exit record with exit code 0. Its pid lies
above Linux's pid_max, so it can never be mistaken for a real process. Everything else — the
claim, the spec, the run files, ``run_started``, the output ingest, ``part_exited`` — is that
code's own.

Celery: one worker in this process consumes every node's queue ``node.<name>`` and delivers
``agent.launch_attempt`` to the agent serving the node (``agent.local_agents``), as each node's own
worker does today; the agents also find placed attempts on their own rounds, as today.

Signals and files: ``ready N`` is printed once the nodes are registered and the worker consumes;
SIGTERM stops cleanly; SIGUSR1 restarts every agent at once (each is registered again and made
anew, as a restarted ``manage.py nodeagent`` would be); the nodes named in the silence file (one a
line) stop heartbeating while it lists them.

The console's models and the agent are imported inside the functions that use them: this module
is a process's entry point, and ``main`` calls ``django.setup()`` before any of them may load.
"""

from __future__ import annotations

import argparse
import heapq
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from django.conf import settings
from django.db import close_old_connections

from agent import runfiles

logger = logging.getLogger("bench.scale.legacy_fleet")

# Above Linux's largest pid_max (2**22): a simulated runner's pid is never a real process's.
SIM_PID_BASE = 1 << 23


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.scale.legacy_fleet", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--gpus", type=int, default=8, help="simulated GPUs per node (8)")
    p.add_argument("--prefix", default="fleet-", help="node names are f'{prefix}{i:04d}'")
    p.add_argument("--run-seconds", type=float, default=1.0, help="how long each simulated run lasts (1)")
    p.add_argument("--silence-file", default=None, help="nodes named in this file (one a line) stop heartbeating")
    p.add_argument("--threads", type=int, default=8, help="scheduler threads serving the agents in turn (8)")
    return p.parse_args(argv)


def say(line: str) -> None:
    """A line on the real stdout (a Celery worker redirects ``sys.stdout`` to its logger)."""
    out = sys.__stdout__
    out.write(line + "\n")
    out.flush()


class Silence:
    """The nodes the silence file names, re-read when it changes (checked at most every 0.2 s)."""

    def __init__(self, path: str | None) -> None:
        self.path = Path(path) if path else None
        self.names: frozenset[str] = frozenset()
        self.seen: float | None = None
        self.checked = 0.0
        self.lock = threading.Lock()

    def __contains__(self, name: str) -> bool:
        if self.path is None:
            return False
        now = time.monotonic()
        if now - self.checked >= 0.2:
            with self.lock:
                self.checked = now
                try:
                    mtime = self.path.stat().st_mtime
                except OSError:
                    mtime = None
                if mtime != self.seen:
                    self.seen = mtime
                    try:
                        self.names = frozenset(x.strip() for x in self.path.read_text().splitlines() if x.strip())
                    except OSError:
                        self.names = frozenset()
        return name in self.names


class SimRun:
    """What ``agent.launch`` keeps of a started supervisor: its pid and ``poll()``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode


class SimRunners:
    """Stands in for ``subprocess`` in ``agent.launch``: ``Popen`` starts a simulated runner."""

    DEVNULL = -3
    STDOUT = -2

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.lock = threading.Lock()
        self.next_pid = SIM_PID_BASE
        self.live: dict[int, SimRun] = {}
        self.due: list[tuple[float, int, Path]] = []
        self.wake = threading.Event()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.serve, name="sim-runners", daemon=True)
        self.started = 0

    def Popen(self, argv: list[str], **_: object) -> SimRun:  # subprocess's name
        """``python -m agent.runner SPEC``: the pid record and the run's one line now, the exit
        record later."""
        directory = Path(argv[-1]).parent
        with self.lock:
            self.next_pid += 1
            run = SimRun(self.next_pid)
            self.live[run.pid] = run
            self.started += 1
        now = time.time()
        runfiles.write_pid(directory, runfiles.PidRecord(runner_pid=run.pid, pgid=None, started_at=now))
        with runfiles.OutputWriter(directory) as out:
            out.emit("simulated run", now)
        with self.lock:
            heapq.heappush(self.due, (time.monotonic() + self.seconds, run.pid, directory))
        self.wake.set()
        return run

    def alive(self, pid: int | None) -> bool:
        return pid in self.live

    def serve(self) -> None:
        while not self.stopped.is_set():
            with self.lock:
                ready = []
                while self.due and self.due[0][0] <= time.monotonic():
                    ready.append(heapq.heappop(self.due))
                wait = (self.due[0][0] - time.monotonic()) if self.due else 1.0
            for _, pid, directory in ready:
                runfiles.write_exit(directory, runfiles.ExitRecord(exit_code=0, signal=None, ended_at=time.time(), lines=1))
                with self.lock:
                    run = self.live.pop(pid)
                run.returncode = 0
            if not ready:
                self.wake.wait(max(0.01, min(wait, 1.0)))
                self.wake.clear()

    def __getattr__(self, name: str):
        return getattr(subprocess, name)


def fleet_agent_class(silence: Silence, runners: SimRunners) -> type:
    from agent.node_agent import NodeAgent

    class FleetAgent(NodeAgent):
        """Today's agent; its heartbeat skips silenced nodes, and a simulated runner counts as
        alive where ``is_runner`` (a real process's command line) cannot see it."""

        def heartbeat(self) -> None:
            if any(n in silence for n in self.node_names):
                return
            super().heartbeat()

        def runner_alive(self, part, directory) -> bool:
            return runners.alive(part.runner_pid) or super().runner_alive(part, directory)

    return FleetAgent


class Slot:
    """One agent and its place in the schedule."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.agent = None
        self.next_round = 0.0
        self.restart = False


class Fleet:
    def __init__(self, args: argparse.Namespace) -> None:
        import agent.launch

        self.args = args
        self.names = [f"{args.prefix}{i:04d}" for i in range(args.nodes)]
        self.silence = Silence(args.silence_file)
        self.runners = SimRunners(args.run_seconds)
        agent.launch.subprocess = self.runners  # the run's OS process, and nothing else, is simulated
        self.interval = settings.AGENT_POLL_INTERVAL
        self.output_interval = min(settings.OUTPUT_POLL_INTERVAL, self.interval)
        self.slots = [Slot(n) for n in self.names]
        self.stopped = threading.Event()
        self.counts = {"steps": 0, "ticks": 0, "late_s": 0.0, "restarts": 0, "errors": 0}
        self.count_lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.agent_label = f"nodeagent@{socket.gethostname()}"
        self.agent_class = fleet_agent_class(self.silence, self.runners)

    # --- agents ----------------------------------------------------------------------------
    def make_agent(self, name: str):
        return self.agent_class([name], name=f"nodeagent-{name}")

    def register(self, names: list[str]) -> None:
        """As ``manage.py nodeagent`` does for its node: register it (simulated GPUs), set its address."""
        from agent.inventory import register_nodes
        from console.management.commands.nodeagent import Command
        from jobs.models import Node

        specs = [Command.node_spec(n, True) for n in names]
        specs = [type(s)(name=s.name, gpu_model=s.gpu_model, gpus=s.gpus[: self.args.gpus], simulated=True) for s in specs]
        nodes = register_nodes(specs, agent=self.agent_label)
        Node.objects.filter(pk__in=[n.pk for n in nodes]).update(address="127.0.0.1")

    def start(self) -> None:
        for i in range(0, len(self.names), 100):
            self.register(self.names[i : i + 100])
        for slot in self.slots:
            slot.agent = self.make_agent(slot.name)
            slot.agent.stop_strays()
        close_old_connections()
        self.runners.thread.start()
        k = max(1, min(self.args.threads, len(self.slots)))
        for t in range(k):
            thread = threading.Thread(target=self.serve, args=(self.slots[t::k],), name=f"agents-{t}", daemon=True)
            thread.start()
            self.threads.append(thread)
        threading.Thread(target=self.report, name="stats", daemon=True).start()

    def restart_all(self) -> None:
        """SIGUSR1: every agent restarts at once (each at its next step, in its own thread)."""
        for slot in self.slots:
            slot.restart = True

    def restart(self, slot: Slot) -> None:
        slot.restart = False
        self.register([slot.name])
        slot.agent = self.make_agent(slot.name)
        slot.agent.stop_strays()
        slot.next_round = 0.0
        with self.count_lock:
            self.counts["restarts"] += 1

    # --- the schedule ----------------------------------------------------------------------
    def serve(self, slots: list[Slot]) -> None:
        """``EmbeddedControlLoop.serve`` for each of ``slots`` in turn: a step when it is due."""
        start = time.monotonic()
        due = [(start + random.random() * self.output_interval, i) for i in range(len(slots))]
        heapq.heapify(due)
        for slot in slots:
            slot.next_round = start + random.random() * self.interval  # the agents did not all start at once
        while not self.stopped.is_set():
            when, i = due[0]
            delay = when - time.monotonic()
            if delay > 0:
                self.stopped.wait(delay)
                continue
            heapq.heappop(due)
            slot, ticked, failed = slots[i], False, False
            try:
                if slot.restart:
                    self.restart(slot)
                if time.monotonic() >= slot.next_round:
                    slot.next_round = time.monotonic() + self.interval
                    ticked = True
                    slot.agent.tick()
                else:
                    slot.agent.collect()
            except Exception:
                failed = True
                logger.exception("agent %s: round failed; retrying", slot.name)
            finally:
                close_old_connections()
            with self.count_lock:
                self.counts["steps"] += 1
                self.counts["ticks"] += ticked
                self.counts["late_s"] += -delay
                self.counts["errors"] += failed
            heapq.heappush(due, (time.monotonic() + self.output_interval, i))

    def report(self) -> None:
        last, t0 = dict(self.counts), time.monotonic()
        while not self.stopped.wait(5.0):
            with self.count_lock:
                now, counts = time.monotonic(), dict(self.counts)
            span, n = now - t0, len(self.slots)
            steps = counts["steps"] - last["steps"]
            say(
                "stats "
                + json.dumps(
                    {
                        "t": time.time(),
                        "agents": n,
                        "steps_per_agent_s": round(steps / span / n, 2),
                        "ticks_per_agent_s": round((counts["ticks"] - last["ticks"]) / span / n, 2),
                        "nominal_steps_per_agent_s": round(1 / self.output_interval, 2),
                        "nominal_ticks_per_agent_s": round(1 / self.interval, 2),
                        "late_ms_mean": round((counts["late_s"] - last["late_s"]) / max(1, steps) * 1000, 1),
                        "runs_started": self.runners.started,
                        "restarts": counts["restarts"],
                        "errors": counts["errors"] - last["errors"],
                    }
                )
            )
            last, t0 = counts, now

    def stop(self) -> None:
        self.stopped.set()
        self.runners.stopped.set()
        self.runners.wake.set()
        for thread in self.threads:
            thread.join(10)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    from jobs.services.messages import node_queue

    fleet = Fleet(args)
    fleet.start()
    stop = threading.Event()

    def on_usr1(*_):
        fleet.restart_all()

    try:
        if settings.SCALE_OUT:
            from celery import signals

            from console.celery import app

            @signals.worker_ready.connect(weak=False)
            def ready(**_):
                try:  # the worker installed its own SIGUSR1 handler (a traceback dump): ours instead
                    signal.signal(signal.SIGUSR1, on_usr1)
                except ValueError:
                    logger.warning("SIGUSR1 handler not installed (not in the main thread)")
                say(f"ready {args.nodes}")

            app.worker_main(
                [
                    "worker",
                    "-Q",
                    ",".join(node_queue(n) for n in fleet.names),
                    "-n",
                    f"legacy-fleet-{os.getpid()}@%h",
                    "-P",
                    "solo",
                    "--without-gossip",
                    "--without-mingle",
                    "--without-heartbeat",
                    "-l",
                    "WARNING",
                ]
            )
        else:
            signal.signal(signal.SIGUSR1, on_usr1)
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            say(f"ready {args.nodes}")
            while not stop.wait(1.0):
                pass
    except KeyboardInterrupt:
        pass
    finally:
        fleet.stop()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    raise SystemExit(main())
