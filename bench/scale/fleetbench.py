"""Benchmark: the control plane at fleet size, with today's code measured in the same run.

    .venv/bin/python -m bench.scale.fleetbench [--quick] [--nodes 1000] [--jobs 10000] ...

Two sides, one after the other, each on a fresh PostgreSQL database and a flushed Redis database:

* **new**: the current tree; its fleet is ``python -m bench.scale.fleet`` (N simulated node agents
  in one process; until that module exists, today's agents in ``bench.scale.legacy_fleet``, said so);
* **baseline**: the tree of commit 42b1241 (``git archive``, with the current ``bench/scale``
  copied in so the harness pieces are the same), with today's agents hosted by
  ``bench.scale.legacy_fleet``: smaller, since each of today's agents polls the database ~20 times
  a second and the machine has 2 cores.

Each side: ``manage.py bootstrap --no-nodes``, the instrumented control worker
(``bench/scale/control.py``: queries per control round) and the fleet process, then

1. idle: PostgreSQL transactions (``pg_stat_database`` xact_commit + xact_rollback) over several
   windows with the control worker paused (SIGSTOP: the fleet's own cost, per node) and one with
   it running (the control worker's cost is the difference);
2. jobs: B batches, each queued in one transaction (as ``bench.scale.scenario`` does with
   ``--submit bulk``) and followed to the end: jobs placed per second (first..last attempt, and the
   busiest second), dispatch → start p50/p95/p99 (attempt created → started_at), queries per
   placement (the control worker's wrapper);
3. lost nodes: the silence file names a few idle nodes; the time until each is NotReady
   (NODE_HEARTBEAT_TIMEOUT lowered for the bench, both sides alike), and that no other node is;
4. storm: SIGUSR1 makes every agent restart at once; no node may go NotReady.

Every figure has its spread (windows, batches, nodes) and the machine's load while it was taken.
The table: figure | new | baseline | target | new / baseline. ``--json PATH`` keeps every number.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.scale import cpu
from bench.scale.cluster import PY, ROOT, Cluster, pg_connect
from bench.scale.fleet_figures import batch_figures, control_rounds, markdown_table, print_table

BASELINE_COMMIT = "42b1241"
PREFIX = "fleet-"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.scale.fleetbench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="~6 minutes: 200 nodes, 2,000 jobs; baseline 20 nodes, 500 jobs")
    p.add_argument("--nodes", type=int, default=None, help="simulated nodes of the new side (1000; --quick 200)")
    p.add_argument("--gpus", type=int, default=8, help="simulated GPUs per node (8)")
    p.add_argument("--jobs", type=int, default=None, help="jobs of the new side, all batches (10000; --quick 2000)")
    p.add_argument("--baseline-nodes", type=int, default=None, help="nodes of the baseline (30; --quick 20; 0: no baseline)")
    p.add_argument("--baseline-jobs", type=int, default=None, help="jobs of the baseline (1000; --quick 500)")
    p.add_argument("--batches", type=int, default=3, help="the jobs are queued in this many batches, one after another (3)")
    p.add_argument("--run-seconds", type=float, default=1.0, help="how long each simulated run lasts (1)")
    p.add_argument("--heartbeat-timeout", type=float, default=20.0, help="NODE_HEARTBEAT_TIMEOUT on both sides (20 s)")
    p.add_argument("--idle-window", type=float, default=None, help="seconds per idle window (30; --quick 20)")
    p.add_argument("--idle-windows", type=int, default=None, help="idle windows with the control worker paused (3; --quick 2)")
    p.add_argument("--lost-nodes", type=int, default=5, help="nodes silenced for the lost-node detection (5)")
    p.add_argument(
        "--paced-rate",
        type=float,
        default=20.0,
        help="after the bulk batches, jobs queued at this steady rate per second, to read dispatch -> start below the fleet's capacity (20; 0: none)",
    )
    p.add_argument("--paced-seconds", type=float, default=15.0, help="how long the paced jobs keep arriving (15 s)")
    p.add_argument(
        "--new-fleet",
        choices=("auto", "fleet", "legacy"),
        default="auto",
        help="the new side's fleet: bench.scale.fleet, or today's agents (auto: fleet where the tree has it)",
    )
    p.add_argument("--baseline-commit", default=BASELINE_COMMIT)
    p.add_argument(
        "--new-tree",
        default=None,
        help="measure this source tree as the new side (the current bench/scale is copied in, its own fleet.py kept); default: this checkout",
    )
    p.add_argument("--only", choices=("new", "baseline"), default=None, help="run one side only")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per batch before giving up")
    p.add_argument("--pg", default=os.environ.get("TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres"))
    p.add_argument("--redis", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/12"), help="the new side's (flushed)")
    p.add_argument("--baseline-redis", default=os.environ.get("BENCH_BASELINE_REDIS_URL", "redis://127.0.0.1:6379/13"))
    p.add_argument("--json", default=None, help="write every figure to this file")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs, run files, the baseline tree)")
    a = p.parse_args(argv)
    a.nodes = a.nodes or (200 if a.quick else 1000)
    a.jobs = a.jobs or (2000 if a.quick else 10000)
    if a.baseline_nodes is None:
        a.baseline_nodes = 20 if a.quick else 30
    a.baseline_jobs = a.baseline_jobs or (500 if a.quick else 1000)
    a.idle_window = a.idle_window or (20.0 if a.quick else 30.0)
    a.idle_windows = a.idle_windows or (2 if a.quick else 3)
    return a


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


# --- the trees ---------------------------------------------------------------------------------
def baseline_tree(tmp: Path, commit: str) -> Path:
    """The tree of ``commit``, with the current ``bench/scale`` copied over it."""
    tree = tmp / "baseline-tree"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    harness_into(tree)
    return tree


def harness_into(tree: Path) -> None:
    """The current harness pieces into another tree (a fleet that tree has of its own stays),
    and the run-file contract the simulated runners write through where that tree has none (the
    files it defines had the same names and fields before it)."""
    for source in (ROOT / "bench" / "scale").glob("*.py"):
        target = tree / "bench" / "scale" / source.name
        if source.name != "fleet.py" or not target.exists():
            shutil.copy2(source, target)
    contract = tree / "agent" / "runfiles.py"
    if not contract.exists():
        shutil.copy2(ROOT / "agent" / "runfiles.py", contract)


def new_fleet_module(choice: str, root: Path = ROOT) -> tuple[str, str]:
    if choice == "legacy" or (choice == "auto" and not (root / "bench" / "scale" / "fleet.py").exists()):
        note = "" if choice == "legacy" else " (bench/scale/fleet.py is not in this tree yet)"
        return "bench.scale.legacy_fleet", f"today's agents (bench.scale.legacy_fleet){note}"
    return "bench.scale.fleet", "the event-driven fleet (bench.scale.fleet)"


# --- one side ----------------------------------------------------------------------------------
class Side:
    def __init__(self, args, *, label: str, root: Path, fleet: str, fleet_note: str, nodes: int, jobs: int, redis_url: str, tmp: Path) -> None:
        self.args, self.label, self.root, self.fleet, self.fleet_note = args, label, root, fleet, fleet_note
        self.nodes, self.jobs = nodes, jobs
        self.tmp = tmp / label
        self.tmp.mkdir()
        self.cluster = Cluster(self.tmp, args.pg, redis_url, f"bench_fb_{label}_{os.getpid()}", args.gpus, root=root)
        self.cluster.env["NODE_HEARTBEAT_TIMEOUT"] = str(args.heartbeat_timeout)
        self.silence = self.tmp / "silence.txt"
        self.names = [f"{PREFIX}{i:04d}" for i in range(nodes)]
        self.db = None
        self.out: dict = {
            "label": label,
            "nodes": nodes,
            "gpus": nodes * args.gpus,
            "jobs": jobs,
            "fleet": fleet_note,
            "tree": str(root),
            "heartbeat_timeout_s": args.heartbeat_timeout,
            "run_seconds": args.run_seconds,
        }

    # --- plumbing ---
    def query(self, sql: str, params=()) -> list[tuple]:
        if self.db is None:
            self.db = pg_connect(self.cluster.env["DATABASE_URL"])
        return self.db.execute(sql, params).fetchall()

    def close_db(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None

    def fleet_log(self) -> str:
        return self.cluster.tail("fleet", chars=10**9)

    def snapshot(self) -> cpu.Snapshot:
        return cpu.Snapshot(self.cluster.pids("control"), self.cluster.pids("fleet"))

    @staticmethod
    def load(a: cpu.Snapshot, b: cpu.Snapshot) -> dict:
        d = cpu.delta(a, b)
        seconds = d["available"] / (os.cpu_count() or 1)
        return {
            "loadavg_1m": round(os.getloadavg()[0], 2),
            "machine_busy_pct": round(100 * d["busy"] / d["available"], 1) if d["available"] else None,
            "cores_used": {k: round(v / seconds, 2) for k, v in d["parts"].items()} if seconds else {},
        }

    # --- phases ---
    def start(self) -> None:
        c = self.cluster
        t0 = time.monotonic()
        c.reset(self.label)
        self.out["bootstrap_s"] = round(time.monotonic() - t0, 1)
        c.stats_path.unlink(missing_ok=True)
        c.spawn("control", [PY, "-m", "bench.scale.control", str(c.stats_path), str(self.tmp / "beat-schedule")])
        t0 = time.monotonic()
        c.spawn(
            "fleet",
            [
                PY,
                "-m",
                self.fleet,
                "--nodes",
                str(self.nodes),
                "--gpus",
                str(self.args.gpus),
                "--prefix",
                PREFIX,
                "--run-seconds",
                str(self.args.run_seconds),
                "--silence-file",
                str(self.silence),
            ],
        )
        ready = ["ready", str(self.nodes)]
        r = c.redis()
        c.wait(
            lambda: any(line.split()[:2] == ready for line in self.fleet_log().splitlines()) and r.exists("_kombu.binding.control"),
            f"the fleet's 'ready {self.nodes}' and the control worker",
            timeout=900,
        )
        want = self.nodes * self.args.gpus
        c.wait(
            lambda: self.query("SELECT count(*) FROM jobs_gpu g JOIN jobs_node n ON n.id = g.node_id WHERE n.state = 'Ready'")[0][0] >= want,
            f"{want} GPUs on Ready nodes",
            timeout=300,
        )
        self.out["fleet_start_s"] = round(time.monotonic() - t0, 1)
        log(f"[{self.label}] {self.nodes} nodes x {self.args.gpus} GPUs ready in {self.out['fleet_start_s']}s ({self.fleet_note})")

    def tx_window(self, seconds: float) -> dict:
        c = self.cluster
        a, x0, t0 = self.snapshot(), c.pg_transactions(), time.time()
        time.sleep(seconds)
        x1, b, t1 = c.pg_transactions(), self.snapshot(), time.time()
        c.check_alive("an idle window")
        # The legacy fleet's stats lines cover the 5 s before their time: those inside the window.
        steps = [s["steps_per_agent_s"] for s in self.schedule_stats() if t0 + 4.5 <= s["t"] <= t1]
        return {"tx_per_s": (x1 - x0) / seconds, "t0": t0, "t1": t1, "steps_per_agent_s": steps, **self.load(a, b)}

    def idle(self) -> None:
        """PostgreSQL transactions of the idle fleet: windows with the control worker paused
        (SIGSTOP, its beat too), then one with it running."""
        self.close_db()  # our own connection stays out of the counts
        time.sleep(5.0)  # registration and start-up settle
        args, control = self.args, self.cluster.procs["control"]
        fleet_only = []
        os.killpg(control.pid, signal.SIGSTOP)
        try:
            time.sleep(2.0)  # PostgreSQL publishes its counters about once a second
            for i in range(args.idle_windows):
                w = self.tx_window(args.idle_window)
                w["tx_per_node_s"] = w["tx_per_s"] / self.nodes
                fleet_only.append(w)
                log(
                    f"[{self.label}] idle window {i + 1}/{args.idle_windows}, control paused: {w['tx_per_s']:.1f} tx/s = "
                    f"{w['tx_per_node_s']:.3f} per node (load {w['loadavg_1m']}, machine {w['machine_busy_pct']}% busy)"
                )
        finally:
            os.killpg(control.pid, signal.SIGCONT)
        time.sleep(3.0)
        whole = self.tx_window(args.idle_window)
        # The control worker's own statements (its wrapper counts them; each transaction has one
        # or more): at most this many of the window's transactions are its.
        rounds = control_rounds(self.cluster.stats_path, whole["t0"], whole["t1"])
        control_q = sum(r["round_q"] for r in rounds) / args.idle_window
        log(
            f"[{self.label}] idle window with the control worker: {whole['tx_per_s']:.1f} tx/s; the control worker's own "
            f"statements {control_q:.1f}/s ({len(rounds)} rounds)"
        )
        self.out["idle"] = {"fleet_only": fleet_only, "with_control": whole, "control_statements_per_s": control_q, "window_s": args.idle_window}
        self.out["idle_schedule"] = self.schedule_stats()

    def schedule_stats(self) -> list[dict]:
        """The legacy fleet's ``stats`` lines so far (how well today's schedule was kept)."""
        rows = []
        for line in self.fleet_log().splitlines():
            if line.startswith("stats {"):
                with contextlib.suppress(ValueError):
                    rows.append(json.loads(line[6:]))
        return rows

    def submit(self, count: int, tag: str, rate: float = 0.0) -> dict:
        done = subprocess.run(
            [PY, "-m", "bench.scale.fleetbench", "submit", "--jobs", str(count), "--label", tag, "--rate", str(rate)],
            check=False,
            cwd=self.root,
            env=self.cluster.env,
            capture_output=True,
            text=True,
        )
        if done.returncode:
            raise RuntimeError(f"submit failed:\n{done.stdout}\n{done.stderr}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    def batches(self) -> None:
        from jobs.statuses import TERMINAL

        terminal = [str(s) for s in TERMINAL]
        sizes = [self.jobs // self.args.batches + (1 if i < self.jobs % self.args.batches else 0) for i in range(self.args.batches)]
        rates = [0.0] * len(sizes)
        paced = round(self.args.paced_rate * self.args.paced_seconds)
        if paced > 0:
            sizes.append(paced)
            rates.append(self.args.paced_rate)
        results = []
        for b, size in enumerate(sizes):
            time.sleep(2.0)
            a = self.snapshot()
            sub = self.submit(size, f"{self.label}{b}", rates[b])
            first, last = sub["first"], sub["last"]
            deadline, next_report = time.monotonic() + self.args.timeout, time.monotonic() + 5
            timed_out, lost = False, set()
            while True:
                counts = dict(self.query("SELECT status, count(*) FROM jobs_trainingjob WHERE id BETWEEN %s AND %s GROUP BY status", (first, last)))
                finished = sum(v for k, v in counts.items() if k in terminal)
                if finished >= size:
                    break
                if time.monotonic() > deadline:
                    timed_out = True
                    log(f"[{self.label}] batch {b + 1} TIMED OUT after {self.args.timeout:.0f}s: {counts}")
                    break
                if time.monotonic() >= next_report:
                    next_report += 5
                    log(f"[{self.label}] batch {b + 1}: t={time.time() - sub['t_submit']:5.1f}s " + " ".join(f"{k}={v}" for k, v in sorted(counts.items())))
                lost.update(self.not_ready())
                self.cluster.check_alive("the jobs")
                time.sleep(0.5)
            t_end = time.time()
            lost.update(self.not_ready())
            failovers = self.query("SELECT coalesce(sum(failover_count), 0) FROM jobs_trainingjob WHERE id BETWEEN %s AND %s", (first, last))[0][0]
            fig = batch_figures(self.query, self.cluster.stats_path, first, last, sub["t_submit"], sub["t_queued"], t_end)
            fig.update(
                jobs=size,
                statuses=counts,
                timed_out=timed_out,
                load=self.load(a, self.snapshot()),
                nodes_lost=sorted(lost),
                failovers=int(failovers),
                paced_rate=rates[b],
            )
            results.append(fig)
            log(
                f"[{self.label}] batch {b + 1}/{len(sizes)}: {size} jobs, placed {fig['placed_per_s']:.1f}/s "
                f"(busiest second {fig['placed_peak_second']}), dispatch->start p95 {fig['dispatch_p95_s']:.3f}s, "
                f"{fig['queries_per_placement']:.2f} queries/placement, done in {fig['makespan_s']:.1f}s"
                + (f"; {len(lost)} nodes went NotReady, {failovers} failovers" if lost or failovers else "")
            )
        self.out["batches"] = [r for r in results if not r["paced_rate"]]
        self.out["paced"] = [r for r in results if r["paced_rate"]]
        self.out["jobs_schedule"] = self.schedule_stats()[len(self.out.get("idle_schedule", [])) :]

    def node_states(self, names: list[str]) -> dict[str, str]:
        return dict(self.query("SELECT name, state FROM jobs_node WHERE name = ANY(%s)", (names,)))

    def not_ready(self) -> list[str]:
        return [n for (n,) in self.query("SELECT name FROM jobs_node WHERE state <> 'Ready' AND name LIKE %s", (PREFIX + "%",))]

    def lost_nodes(self) -> None:
        k = max(1, min(self.args.lost_nodes, self.nodes - 1))
        chosen = sorted({self.names[(i + 1) * self.nodes // (k + 1)] for i in range(k)})
        tmp = self.silence.with_suffix(".tmp")
        tmp.write_text("\n".join(chosen) + "\n")
        t0 = time.time()
        tmp.replace(self.silence)
        seen: dict[str, float] = {}
        others: set[str] = set()
        deadline = time.monotonic() + 4 * self.args.heartbeat_timeout + 30
        while len(seen) < len(chosen) and time.monotonic() < deadline:
            now = time.time()
            for name in self.not_ready():
                if name in chosen:
                    seen.setdefault(name, now - t0)
                else:
                    others.add(name)
            time.sleep(0.2)
        times = [seen.get(n) for n in chosen]
        self.out["lost"] = {
            "nodes": chosen,
            "detected_s": times,
            "undetected": [n for n in chosen if n not in seen],
            "other_nodes_not_ready": sorted(others),
            "timeout_s": self.args.heartbeat_timeout,
        }
        log(
            f"[{self.label}] lost-node detection (timeout {self.args.heartbeat_timeout:.0f}s): "
            + ", ".join(f"{n} {t:.1f}s" if t is not None else f"{n} not detected" for n, t in zip(chosen, times, strict=True))
            + (f"; other nodes NotReady: {len(others)}" if others else "")
        )
        self.silence.unlink()
        deadline = time.monotonic() + 3 * self.args.heartbeat_timeout + 30
        while self.not_ready() and time.monotonic() < deadline:
            time.sleep(0.5)
        self.out["lost"]["back_ready"] = not self.not_ready()

    def storm(self) -> None:
        """SIGUSR1: every agent restarts at once; watch that no node goes NotReady."""
        fleet = self.cluster.procs["fleet"]
        before = set(self.not_ready())
        window = max(15.0, 1.5 * self.args.heartbeat_timeout)
        x0, t0 = self.cluster.pg_transactions(), time.monotonic()
        os.kill(fleet.pid, signal.SIGUSR1)
        worst: set[str] = set()
        while time.monotonic() - t0 < window:
            worst |= set(self.not_ready()) - before
            if fleet.poll() is not None:
                break
            time.sleep(0.5)
        time.sleep(1.0)
        alive = fleet.poll() is None
        self.out["storm"] = {
            "window_s": window,
            "not_ready": sorted(worst),
            "fleet_alive": alive,
            "tx_per_node_s": (self.cluster.pg_transactions() - x0) / (time.monotonic() - t0) / self.nodes,
        }
        log(f"[{self.label}] storm (SIGUSR1): {len(worst)} nodes went NotReady within {window:.0f}s" + ("" if alive else "; THE FLEET PROCESS EXITED"))

    def run(self) -> dict:
        try:
            self.start()
            self.idle()
            self.batches()
            self.lost_nodes()
            self.storm()
            self.out["schedule"] = self.schedule_stats()
        finally:
            self.close_db()
            self.cluster.stop()
            try:
                self.cluster.drop()
                self.cluster.redis().flushdb()
            except Exception as exc:
                print(f"clean-up: {exc}", file=sys.stderr)
        return self.out


# --- the command ---------------------------------------------------------------------------------
def submit_main(argv: list[str]) -> int:
    """``python -m bench.scale.fleetbench submit --jobs N --label L`` (run in a side's tree): queue
    the jobs in one transaction; prints the first and last id and when."""
    p = argparse.ArgumentParser(prog="python -m bench.scale.fleetbench submit")
    p.add_argument("--jobs", type=int, required=True)
    p.add_argument("--label", required=True)
    p.add_argument("--command", default='python -c "pass"')
    p.add_argument("--rate", type=float, default=0.0, help="jobs per second, queued in one transaction per second (0: all at once)")
    a = p.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    from bench.scale.scenario import submit

    t0 = time.time()
    if a.rate > 0:
        ids, second = [], 0
        while len(ids) < a.jobs:
            n = min(a.jobs - len(ids), max(1, round(a.rate * (second + 1))) - len(ids))
            if n > 0:
                ids += submit(n, a.command, 1, "bulk", f"{a.label}-{second}")
            second += 1
            time.sleep(max(0.0, t0 + second - time.time()))
    else:
        ids = submit(a.jobs, a.command, 1, "bulk", a.label)
    print(json.dumps({"first": min(ids), "last": max(ids), "n": len(ids), "t_submit": t0, "t_queued": time.time()}))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["submit"]:
        return submit_main(argv[1:])
    if argv[:1] == ["table"]:  # table RESULTS.json [--markdown]: print a kept run's table again
        results = json.loads(Path(argv[1]).read_text())
        if "--markdown" in argv:
            print(markdown_table(results.get("new"), results.get("baseline")))
        else:
            print_table(results.get("new"), results.get("baseline"))
        return 0
    args = parse(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-fleet-"))

    def on_term(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    results: dict = {"machine": machine(), "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "args": vars(args)}
    failed = False
    try:
        new_root = ROOT
        if args.new_tree:
            new_root = Path(args.new_tree).resolve()
            harness_into(new_root)
        fleet, note = new_fleet_module(args.new_fleet, new_root)
        log(
            f"fleet benchmark: new side {args.nodes} nodes x {args.gpus} GPUs, {args.jobs} jobs in {args.batches} batches, fleet: {note}; "
            f"baseline ({args.baseline_commit}) {args.baseline_nodes} nodes, {args.baseline_jobs} jobs; runs {args.run_seconds:g}s; "
            f"NODE_HEARTBEAT_TIMEOUT {args.heartbeat_timeout:g}s; machine: {results['machine']}; work dir {tmp}"
        )
        sides = []
        if args.only != "baseline":
            sides.append(dict(label="new", root=new_root, fleet=fleet, fleet_note=note, nodes=args.nodes, jobs=args.jobs, redis_url=args.redis))
        if args.only != "new" and args.baseline_nodes:
            tree = baseline_tree(tmp, args.baseline_commit)
            sides.append(
                dict(
                    label="baseline",
                    root=tree,
                    fleet="bench.scale.legacy_fleet",
                    fleet_note=f"today's agents at {args.baseline_commit} (bench.scale.legacy_fleet)",
                    nodes=args.baseline_nodes,
                    jobs=args.baseline_jobs,
                    redis_url=args.baseline_redis,
                )
            )
        for spec in sides:
            t0 = time.monotonic()
            try:
                results[spec["label"]] = Side(args, tmp=tmp, **spec).run()
            except Exception as exc:
                failed = True
                results[spec["label"]] = {"label": spec["label"], "error": f"{type(exc).__name__}: {exc}"}
                log(f"[{spec['label']}] FAILED: {exc}")
            log(f"[{spec['label']}] done in {time.monotonic() - t0:.0f}s")
        print_table(results.get("new"), results.get("baseline"))
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1, default=str))
        failed = failed or any(b.get("timed_out") for side in ("new", "baseline") for b in results.get(side, {}).get("batches", []))
        return 1 if failed else 0
    except KeyboardInterrupt:
        print("interrupted; cleaning up", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if args.keep or failed:
            print(f"work directory kept: {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def machine() -> str:
    import psutil

    return f"{os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB"


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    raise SystemExit(main())
