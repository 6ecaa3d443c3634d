"""A simulated fleet: N node agents in one process, for measuring the control plane at scale.

    python -m bench.scale.fleet --nodes N --gpus 8 --prefix fleet- --run-seconds S [--silence-file F]

Each simulated node is a real ``agent.node_agent.NodeAgent`` against the real database and broker
(``DATABASE_URL``, ``REDIS_URL``): it registers its node (simulated GPUs), beats (Redis), consumes
its own queue ``node.<name>`` (one kombu consumer over all N queues decodes the Celery task
messages and hands each to its node's agent: ``agent.launch_attempt``, ``agent.reconcile``),
reconciles, launches, collects output and exits, and runs its plug-ins (health checks, usage
samples). Only the OS process of a run is simulated (``SimLauncher``, the agent's pluggable
process layer): a run starts at once (the agent's real ``runs.part_started`` path), writes its
pid record and one output line (``agent.runfiles``; ingested by the real path), and after S
seconds its exit record with code 0 (the real exit path); a stop signal ends it at once.

A few worker threads step the agents when each is due (``NodeAgent.delay``) or woken, so 1,000
nodes need a handful of database connections, not 1,000 threads.

Prints ``ready N`` once every node is registered and its queue consumed. SIGTERM: a clean stop.
SIGUSR1: every agent restarts at once (new agent objects, a first beat, registration, stray
runs: a process restart, the heartbeat storm); simulated runs survive, as runner processes do.
``--silence-file F``: while F exists, the node names it lists (one a line) stop beating.

The console's models and the agent are imported inside the functions that use them: this module
is a process's entry point, and ``main`` calls ``django.setup()`` before any of them may load.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import itertools
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from django.conf import settings
from django.db import close_old_connections
from kombu import Connection, Exchange, Queue

from agent import local_agents, runfiles
from jobs import heartbeats

logger = logging.getLogger("bench.scale.fleet")

FIRST_FAKE_PID = 10_000_000  # above Linux's pid_max (4,194,304): never a real process


class SimRuns:
    """The fleet's process table: simulated runs survive an agent restart, as runners do."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.lock = threading.Lock()
        self.runs: dict[int, Path] = {}  # pid → run directory, until its exit is written
        self.ends: list[tuple[float, int]] = []
        self.pids = itertools.count(FIRST_FAKE_PID)

    def start(self, directory: Path, text: str) -> int:
        with self.lock:
            pid = next(self.pids)
            self.runs[pid] = directory
            heapq.heappush(self.ends, (time.monotonic() + self.seconds, pid))
        runfiles.write_pid(directory, runfiles.PidRecord(runner_pid=pid, pgid=pid, started_at=time.time()))
        with runfiles.OutputWriter(directory) as out:
            out.emit(text, time.time())
        return pid

    def alive(self, pid: int) -> bool:
        return pid in self.runs

    def end(self, pid: int, *, code: int | None = 0, sig: int | None = None) -> bool:
        with self.lock:
            directory = self.runs.pop(pid, None)
        if directory is None:
            return False
        runfiles.write_exit(directory, runfiles.ExitRecord(exit_code=code, signal=sig, ended_at=time.time(), lines=1))
        return True

    def serve(self, stopped: threading.Event) -> None:
        while not stopped.wait(0.05):
            now = time.monotonic()
            due = []
            with self.lock:
                while self.ends and self.ends[0][0] <= now:
                    due.append(heapq.heappop(self.ends)[1])
            for pid in due:
                self.end(pid)


def make_classes():
    """The agent classes, made after ``django.setup()``."""
    from agent.launch import Launcher
    from agent.node_agent import NodeAgent
    from agent.processes import run_dir

    class SimLauncher(Launcher):
        """The agent's process layer with the OS process simulated; everything else is real."""

        def __init__(self, node_names: list[str], runs: SimRuns) -> None:
            super().__init__(node_names)
            self.runs = runs

        def containers_ready(self) -> tuple[bool, str]:
            return True, "simulated"

        def sweep_strays(self, live: set[str]) -> None:
            """Simulated runs leave no container or job network: no container engine is asked
            (each agent's start asked it three times: 150 engine calls per fleet start)."""

        def pull(self, job, attempt):
            from agent.engine import PullResult

            digest = "sha256:" + "0" * 64
            return PullResult(True, digest, "simulated pull"), f"{job.image}@{digest}"

        def start_runner(self, job, attempt, part, dirs, **_) -> int:
            directory = run_dir(part)
            directory.mkdir(parents=True, exist_ok=True)
            runfiles.clear_stale(directory)
            return self.runs.start(directory, f"simulated run of job {job.pk} on {part.node.name}")

        def alive(self, pid: int) -> bool:
            return self.runs.alive(pid)

        def signal(self, part, sig: int) -> bool:
            return self.runs.end(part.runner_pid, code=None, sig=sig) or part.runner_pid in self.runs.runs

    class FleetAgent(NodeAgent):
        silenced: set[str] = set()

        def heartbeat(self) -> None:
            if self.node_names[0] in FleetAgent.silenced:
                self.next_beat = time.monotonic() + 0.2  # this node's agent "hangs": its beats stop
                return
            super().heartbeat()

    return SimLauncher, FleetAgent


class Scheduler:
    """Steps each agent when it is due or woken, on a few worker threads (one at a time per agent)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.heap: list[tuple[float, int, object]] = []
        self.due: dict[int, float] = {}
        self.busy: set[int] = set()
        self.again: set[int] = set()
        self.seq = itertools.count()
        self.stopped = False

    def schedule(self, agent, delay: float = 0.0) -> None:
        at = time.monotonic() + delay
        with self.cond:
            key = id(agent)
            if key in self.busy:
                if delay <= 0:
                    self.again.add(key)
                return
            if key in self.due and self.due[key] <= at:
                return
            self.due[key] = at
            heapq.heappush(self.heap, (at, next(self.seq), agent))
            self.cond.notify()

    def take(self):
        with self.cond:
            while not self.stopped:
                now = time.monotonic()
                while self.heap:
                    at, _, agent = self.heap[0]
                    key = id(agent)
                    if self.due.get(key) != at or key in self.busy:
                        heapq.heappop(self.heap)  # stale entry
                        continue
                    break
                if self.heap and self.heap[0][0] <= now:
                    _, _, agent = heapq.heappop(self.heap)
                    del self.due[id(agent)]
                    self.busy.add(id(agent))
                    return agent
                self.cond.wait(min(1.0, self.heap[0][0] - now) if self.heap else 1.0)
            return None

    def done(self, agent, delay: float) -> None:
        with self.cond:
            key = id(agent)
            self.busy.discard(key)
            if key in self.again:
                self.again.discard(key)
                delay = 0.0
        if not getattr(agent, "retired", False):
            self.schedule(agent, delay)

    def work(self) -> None:
        while (agent := self.take()) is not None:
            delay = 0.5
            if agent.retired:  # replaced by a restart
                self.done(agent, delay)
                continue
            try:
                if not agent.started:
                    agent.start_up()
                agent.step()
                delay = agent.delay()
            except Exception:
                logger.exception("agent %s: step failed", agent.name)
                close_old_connections()
            finally:
                self.done(agent, delay)

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()


class Fleet:
    def __init__(self, args) -> None:
        self.args = args
        self.names = [f"{args.prefix}{i:04d}" for i in range(1, args.nodes + 1)]
        self.runs = SimRuns(args.run_seconds)
        self.SimLauncher, self.FleetAgent = make_classes()
        self.scheduler = Scheduler()
        self.agents: dict[str, object] = {}
        self.stopped = threading.Event()
        self.restart_requested = threading.Event()
        self.host = socket.gethostname()
        if not settings.SCALE_OUT:
            raise SystemExit("the fleet needs REDIS_URL (scale-out): its nodes consume Celery queues")

    # --- nodes ---------------------------------------------------------------------------------
    def specs(self):
        from agent.inventory import GpuSpec, NodeSpec

        model = settings.SIMULATED_GPU_MODEL
        return [
            NodeSpec(
                name=name,
                gpu_model=model,
                simulated=True,
                gpus=tuple(GpuSpec(index=i, uuid=f"GPU-sim-{name}-{i}", model=model, memory_mb=81559) for i in range(self.args.gpus)),
            )
            for name in self.names
        ]

    def register(self) -> None:
        """What each agent's start does before its loop: a first beat, then registration."""
        from agent.inventory import register_nodes
        from jobs.models import Node

        heartbeats.beat(self.names, time.time())  # first, before anything slow
        specs = self.specs()
        for start in range(0, len(specs), 50):
            batch = specs[start : start + 50]
            register_nodes(batch, agent=f"fleet@{self.host}")
            Node.objects.filter(name__in=[s.name for s in batch]).update(address="127.0.0.1")

    def make_agents(self) -> None:
        fleet = self
        for name in self.names:
            old = self.agents.get(name)
            if old is not None:
                old.retired = True
                local_agents.discard(old)
            agent = self.FleetAgent([name], name=f"fleet-{name}", launcher=self.SimLauncher([name], self.runs))
            agent.retired = False
            agent.started = False

            def start_up(agent=agent) -> None:
                agent.stop_strays()
                agent.started = True

            agent.start_up = start_up
            agent.notify = lambda agent=agent: fleet.scheduler.schedule(agent)
            self.agents[name] = agent
        for agent in list(self.agents.values()):
            self.scheduler.schedule(agent)

    def restart(self) -> None:
        """Every agent restarts at once: new agent objects, their first beats, registration."""
        started = time.monotonic()
        heartbeats.beat(self.names, time.time())
        self.make_agents()
        self.register()
        close_old_connections()
        print(f"restarted {len(self.names)} {time.monotonic() - started:.1f}", flush=True)

    # --- the broker ----------------------------------------------------------------------------
    def consume(self, consuming: threading.Event) -> None:
        from jobs.services.messages import LAUNCH_TASK, RECONCILE_TASK, node_queue

        by_queue = {node_queue(n): n for n in self.names}
        queues = [Queue(q, Exchange(q, type="direct"), routing_key=q) for q in by_queue]

        def on_message(body, message) -> None:
            try:
                task = message.headers.get("task")
                args = body[0] if isinstance(body, (list, tuple)) else body.get("args", [])
                queue = message.delivery_info.get("routing_key") or ""
                agent = self.agents.get(by_queue.get(queue, ""))
                if agent is None:
                    logger.warning("message %s for unknown queue %r", task, queue)
                elif task == LAUNCH_TASK:
                    agent.request_launch(int(args[0]))
                elif task == RECONCILE_TASK:
                    agent.wake()
            except Exception:
                logger.exception("undecodable message")
            finally:
                message.ack()

        while not self.stopped.is_set():
            try:
                with Connection(settings.CELERY_BROKER_URL) as conn, conn.Consumer(queues, callbacks=[on_message], accept=["json"]):
                    consuming.set()
                    while not self.stopped.is_set():
                        with contextlib.suppress(TimeoutError):
                            conn.drain_events(timeout=1)
            except Exception:
                logger.exception("broker connection lost; reconnecting")
                time.sleep(1)

    def watch_silence(self) -> None:
        path = Path(self.args.silence_file) if self.args.silence_file else None
        while not self.stopped.wait(0.2):
            names: set[str] = set()
            if path is not None:
                try:
                    names = {line.strip() for line in path.read_text().splitlines() if line.strip()}
                except OSError:
                    names = set()
            self.FleetAgent.silenced = names

    def keep_beating(self) -> None:
        """Every agent's beat on time. A real agent beats from its own loop on its own machine,
        never queued behind other nodes' work; here the workers step up to a thousand agents in
        turn, so under load a beat would wait behind the others' launches and exits and healthy
        nodes would be taken as lost. Each agent still makes its own beat, as it would."""
        while not self.stopped.wait(0.25):
            for agent in list(self.agents.values()):
                if agent.started and not agent.retired:
                    try:
                        agent.heartbeat()
                    except Exception:
                        logger.exception("agent %s: heartbeat failed", agent.name)

    # --- the process ---------------------------------------------------------------------------
    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self.stopped.set())
        signal.signal(signal.SIGINT, lambda *_: self.stopped.set())
        signal.signal(signal.SIGUSR1, lambda *_: self.restart_requested.set())
        self.register()
        self.make_agents()
        threads = [threading.Thread(target=self.scheduler.work, name=f"fleet-worker-{i}", daemon=True) for i in range(self.args.workers)]
        consuming = threading.Event()
        threads.append(threading.Thread(target=self.consume, args=(consuming,), name="fleet-consumer", daemon=True))
        threads.append(threading.Thread(target=self.runs.serve, args=(self.stopped,), name="fleet-runs", daemon=True))
        threads.append(threading.Thread(target=self.watch_silence, name="fleet-silence", daemon=True))
        threads.append(threading.Thread(target=self.keep_beating, name="fleet-beats", daemon=True))
        for thread in threads:
            thread.start()
        while not consuming.wait(0.2) or not all(a.started for a in self.agents.values()):
            if self.stopped.is_set():
                break
        if not self.stopped.is_set():
            print(f"ready {len(self.names)}", flush=True)
        while not self.stopped.wait(0.2):
            if self.restart_requested.is_set():
                self.restart_requested.clear()
                self.restart()
        self.scheduler.stop()
        for thread in threads:
            thread.join(5)
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale.fleet", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--prefix", default="fleet-")
    parser.add_argument("--run-seconds", type=float, default=1.0)
    parser.add_argument("--silence-file", default=None)
    parser.add_argument("--workers", type=int, default=4, help="threads stepping the agents (database connections)")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return Fleet(args).run()


if __name__ == "__main__":
    sys.exit(main())
