"""``make test``: every lane of the suite, in two streams so that both cores stay busy.

* The **system** stream runs what starts containers, consoles, browsers and clusters: the default
  image (built once, before any test pulls it), then the apps' slow tests on SQLite but the jobs
  and logs apps'. Alone, it keeps about two thirds of a core busy (1,075 CPU-s in 1,638 s on a 2-core
  machine).
* The **cpu** stream runs beside it at a lower priority (``nice``), so the system stream's
  processes get the CPU first: the gate, the fast tests on every core, the libraries' slow tests
  (ckptlib's training processes, the client, the benchmarks), the browser tests whose outcome
  depends on the backend again on a one-host Slurm cluster (after the default image), with ``--torch-pin`` ckptlib on the guide's torch
  2.12.1 (after ``.ci/run`` installed it), the jobs and logs apps' slow tests and three modules more (``CPU_STREAM_APPS``, ``CPU_STREAM_MODULES``:
  the two streams then end together), and last the apps' database tests again on PostgreSQL, on every
  core (a one-core lane at the end would leave the other core idle).

A third stream of waiting lanes (the browser tests split off) was tried: the machine's cores were
busy from the first lane to the last either way (``vmstat``: 0-1 % idle), and with two streams at
full priority the niced lanes got so little CPU that two tests waiting on real runs timed out.
Tried again after the suite's CPU cuts (2026-12-07), when a run's machine sat 26 % idle (vmstat,
1,847 s): the apps' slow tests in two lanes side by side (agent, failover, notify | jobs, logs,
console) kept it 1-2 % idle and took 1,475 and 1,513 s, against 1,600 + 296 s one after the other;
the niced lanes slowed as much (ckptlib's 608 s → over 1,600 s), so the run did not end sooner.
A third stream below the cpu stream (2026-12-08: ckptlib's and the benchmarks' slow tests at
``nice`` 15, to take the 11-26 % idle of two-stream runs) kept the machine 0-3 % idle, yet the run
took 2,078 s against 1,958-1,985 s: the system lane slowed 1,681-1,720 → 1,826 s (its jobs run
niced too, ``RUN_NICENESS``) and the browser tests on Slurm 293 → 569 s. Not settled: the next run,
two streams again, was as slow in those lanes (browser tests on Slurm 576 s, ckptlib 916 s): the
machine had slowed too. Measure both layouts again on one machine state before choosing.
Process accounting (``accton``, ``sa``) over a whole run (2026-12-08, 2,054 s): 3,318 CPU-s, of
which 1,867 in the host's Python processes (the lanes' pytest, consoles and agents), 324 in the
jobs' containers and 255 as the Slurm clusters' service account (rootless Podman, unpacking the
default image on each node). The tests' own wait loops were the largest cut found: ten full
control and agent rounds a second (``embedded_round``) while a test waited on a run. They now
wait on the console's schedule (``harness.node_agent.pump_until``): the Slurm Xid test's process
alone 24.8 → 17 CPU-s. Whole runs did not show it above their noise: sqlite-system 1,683 s / 758
CPU-s and 1,769 s / 868 CPU-s in two runs of that code (2,026 and 2,121 s in all), against 1,752 s
/ 842 CPU-s before it; the lanes it did not touch moved 10-20 % between those runs.
Two pytest-xdist workers in the one lane failed 78 database tests with SynchronousOnlyOperation.
A suspect, not proven: Playwright's sync API leaves its loop running in the main thread of a
process that has run a browser session; yet the same modules pass in one process, in their order.

Every test runs in exactly one SQLite lane (``-m "not slow"`` on every path, ``-m slow`` split by
path), as before. Each lane writes ``var/lanes/<lane>.log``; this prints each lane's start and end,
the whole log of a lane that failed, and each lane's time; ``$LANE_TIMES`` (``.ci/run``) gets
``<lane> <seconds> <exit> <CPU seconds>`` lines (CPU: user and system time of the lane's
processes, those it waited for; a container's processes are Podman's, not counted). It exits
non-zero when any lane failed; every lane runs anyway.

Run from the repository root: ``python harness/lane_runner.py [--torch-pin] [pytest args]``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "var" / "lanes"
PY = sys.executable
APPS = ("jobs", "logs", "agent", "failover", "notify", "console")
# The apps whose slow tests run in the cpu stream (after the default image) rather than the system
# stream: the system stream is the longer one (a run's critical path). The jobs app's slow tests
# (the Slurm client's, the scale-out live status, Spot yields, image pulls) moved first; with them
# the cpu stream still ended 274 s before the system stream (a quiet CI run: 1,516 of 1,790 s), so
# the logs app's (its browser floods: no timing asserted, and the jobs lane's live console serves
# them) followed.
CPU_STREAM_APPS = ("jobs", "logs")
# And these modules of the other apps: with the fast lane's CPU cut (2026-12-07), the cpu stream
# would end ~150 s before the system stream (1,591 of 1,740 s in a quiet run). None waits on a
# clock a niced process could miss: the PostgreSQL lane's selection (41 s), the API's schema fuzz
# (22 s) and manage.py with environment files (23 s). With the torch 2.12.1 lane's DeepSpeed
# experiment cut (2026-12-08: that lane 221 → 172 CPU-s), the runs that leave nothing behind (65 s: real
# containers, each wait a minute or more, the longest 60 s + 3 s a run).
CPU_STREAM_MODULES = (
    "console/tests/test_pg_pass.py",
    "console/tests/test_api_schema_fuzz.py",
    "console/tests/test_envfile.py",
    "agent/tests/test_nothing_outlives_a_run.py",
)
LIBRARIES = ("ckptlib", "client", "bench")
TORCH_PIN_RC = ROOT / "var" / "torch-pin-install.rc"  # .ci/run writes the install's exit code here
TORCH_PIN_LOG = ROOT / "var" / "torch-pin-install.log"
NICE = ("nice", "-n", "10")

# The local registry and the default image in it, as the suite's fixtures and runconsole use them.
DEFAULT_IMAGE = """
import os, sys
from pathlib import Path
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
import django
django.setup()
from django.conf import settings
from agent import engine
from agent.default_image import ensure
from jobs.services.images import qualify
root = Path(os.environ.get("CONTAINER_ENGINE_ROOT") or "var/podman").absolute()
ready, why = engine.availability(root)
if os.environ.get("JOB_SANDBOX") == "off" or not ready:
    print(f"default image SKIPPED: jobs cannot run in containers here ({why or 'JOB_SANDBOX=off'})")
    sys.exit(1 if os.environ.get("REQUIRE_SANDBOX") == "1" else 0)
figures = ensure(root, settings.LOCAL_REGISTRY_PORT, qualify(settings.DEFAULT_IMAGE).split("/", 1)[1])
print("default image:", figures.get("alias"), "(in the registry already)" if figures.get("cached") else f"built in {figures['seconds_total']:.0f} s")
"""
TORCH_PIN_WAIT = f"""
import sys, time
from pathlib import Path
rc = Path({str(TORCH_PIN_RC)!r})
while not rc.exists():
    time.sleep(5)
code = int(rc.read_text().strip() or 1)
if code:
    log = Path({str(TORCH_PIN_LOG)!r})
    print(log.read_text(errors="replace")[-4000:] if log.exists() else "", "the torch 2.12.1 venv did not install", sep="\\n")
sys.exit(code)
"""


@dataclass
class Lane:
    name: str
    commands: list[list[str]]
    env: dict[str, str] = field(default_factory=dict)
    after: str = ""  # a lane of another stream that must have ended first
    nice: bool = False  # CPU-bound: at a lower priority than the lanes that wait on processes
    seconds: int = 0
    cpu_seconds: int = 0  # user + system time of its commands and every process they waited for
    rc: int | None = None
    done: threading.Event = field(default_factory=threading.Event)


def lanes(pytest_args: list[str], torch_pin: bool) -> list[list[Lane]]:
    """The streams, each a list of lanes run one after the other."""

    # Each pytest lane's log ends with its slowest tests (where the time goes, trial after trial),
    # and var/lanes/<lane>.xml holds every test's time (JUnit XML).
    def pytest(lane: str) -> list[str]:
        return [PY, "-m", "pytest", "--durations=30", f"--junitxml={LOGS / lane}.xml", *pytest_args]

    system = [
        Lane("default-image", [[PY, "-c", DEFAULT_IMAGE]]),
        Lane(
            "sqlite-system",
            [
                [
                    *pytest("sqlite-system"),
                    "-m",
                    "slow",
                    *(f"--ignore={path}" for path in CPU_STREAM_MODULES),
                    *(app for app in APPS if app not in CPU_STREAM_APPS),
                ]
            ],
        ),
    ]
    browser_tests = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "console" / "tests").glob("test_browser_*.py"))
    cpu = [
        Lane("gate", [["make", "--no-print-directory", "lint"]], nice=True),
        # schemathesis's plug-in serves the API fuzz module alone, which is slow (Makefile: FAST_PYTEST).
        Lane("sqlite-fast", [[*pytest("sqlite-fast"), "-m", "not slow", "-n", "auto", "-p", "no:schemathesis"]], nice=True),
        Lane("sqlite-libraries", [[*pytest("sqlite-libraries"), "-m", "slow", *LIBRARIES]], nice=True),
        # The browser tests whose outcome depends on the backend (a run's start, stop, failover,
        # logs, samples, nodes): the layout, text and form tests (``backend_neutral``) read what
        # any backend's run left in the console's database, the same as on the agents.
        Lane(
            "browser-on-slurm",
            [[*pytest("browser-on-slurm"), "-m", "not backend_neutral", *browser_tests]],
            env={"BROWSER_BACKEND": "slurm"},
            after="default-image",
            nice=True,
        ),
    ]
    if torch_pin:
        # ckptlib on the guide's torch; the SIGTERM/SIGKILL stress tests (the exactness suite's
        # kills at random moments on every path among them) run on 2.13.0 only. The 2.12.1 lane
        # keeps every other test: the Trainer, accelerate and DeepSpeed integrations, the examples.
        stress = ("test_sigterm_exactness.py", "test_sigkill_during_persist.py", "test_exactness_suite.py")
        skip = " ".join(f"--ignore=ckptlib/tests/{name}" for name in stress)
        make = ["make", "--no-print-directory", "-f", "ckptlib/tests/torch_pin.mk", "test-ckptlib-torch212", f"TORCH_PIN_PYTEST_ARGS={skip}"]
        cpu.append(Lane("torch-2.12.1", [[PY, "-c", TORCH_PIN_WAIT], make], nice=True))
    cpu.append(
        Lane("sqlite-system-niced", [[*pytest("sqlite-system-niced"), "-m", "slow", *CPU_STREAM_APPS, *CPU_STREAM_MODULES]], after="default-image", nice=True)
    )
    # Last: on every core, so the run's tail keeps both cores busy.
    cpu.append(Lane("postgresql", [[PY, "-m", "console.tests.pg_pass", *pytest_args]], nice=True))
    return [system, cpu]


SAYING = threading.Lock()  # the streams' threads print whole lines


def say(text: str) -> None:
    with SAYING:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def run_stream(stream: list[Lane], by_name: dict[str, Lane]) -> None:
    for lane in stream:
        if lane.after:
            by_name[lane.after].done.wait()
        log_path = LOGS / f"{lane.name}.log"
        say(f"lane {lane.name} started (log {log_path.relative_to(ROOT)})")
        start = time.monotonic()
        rc = 0
        with open(log_path, "wb") as log:
            for command in lane.commands:
                try:
                    process = subprocess.Popen(
                        [*(NICE if lane.nice else ()), *command], cwd=ROOT, env={**os.environ, **lane.env}, stdout=log, stderr=subprocess.STDOUT
                    )
                    # wait4: this lane's own CPU time, although other lanes' processes run beside it.
                    _, status, usage = os.wait4(process.pid, 0)
                    process.returncode = rc = os.waitstatus_to_exitcode(status)
                    lane.cpu_seconds += round(usage.ru_utime + usage.ru_stime)
                except OSError as exc:  # a command that is not there: the lane fails, the others go on
                    log.write(f"{' '.join(command[:3])}: {exc}\n".encode())
                    rc = 127
                if rc:
                    break
        lane.seconds, lane.rc = round(time.monotonic() - start), rc
        lane.done.set()
        say(f"lane {lane.name}: {lane.seconds} s, {lane.cpu_seconds} CPU-s (exit {rc})")


def main(argv: list[str]) -> int:
    torch_pin = "--torch-pin" in argv
    pytest_args = [arg for arg in argv if arg != "--torch-pin"]
    LOGS.mkdir(parents=True, exist_ok=True)
    streams = lanes(pytest_args, torch_pin)
    every = [lane for stream in streams for lane in stream]
    by_name = {lane.name: lane for lane in every}
    threads = [threading.Thread(target=run_stream, args=(stream, by_name)) for stream in streams]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    failed = [lane for lane in every if lane.rc]
    for lane in failed:
        print(f"\n===== lane {lane.name} FAILED (exit {lane.rc}): var/lanes/{lane.name}.log =====")
        print((LOGS / f"{lane.name}.log").read_text(errors="replace"), flush=True)
    print("\n--- lanes (seconds, CPU seconds, exit) ---")
    times = os.environ.get("LANE_TIMES")
    for lane in every:
        tail = (LOGS / f"{lane.name}.log").read_text(errors="replace").strip().splitlines()[-1:] or [""]
        print(f"{lane.name:18} {lane.seconds:5d} s {lane.cpu_seconds:5d} CPU-s  exit {lane.rc}  {tail[0][:100]}")
        if times:
            with open(times, "a") as out:
                out.write(f"{lane.name} {lane.seconds} {lane.rc} {lane.cpu_seconds}\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
