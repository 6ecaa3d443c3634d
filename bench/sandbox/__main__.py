"""The cost of running a job in its container: ``python -m bench.sandbox``.

Both sides run the same command the way a runner does (in a new session, stdout piped): once as
a bare process on the host, and once as a job runs now: ``podman run`` of the default image by
digest (``agent.sandbox.container_argv``: every capability dropped, no-new-privileges, a PID
limit, the project's uid, no network but loopback, its work and output directories, ckptlib's
vendor directory and stand-in GPU devices mounted) and, where the node allows one, in a cgroup of
its own with a CPU quota of the machine's cores and a 4 GiB memory limit (made, joined and removed
per run, as the runner does). The two are interleaved: each pair runs both, the order flipping
from one pair to the next, so load on the machine hits both alike; each pair's difference is
printed with its spread, beside each side's own.

* start: Popen → the first line the job prints (``python -c 'print(1)'``), ``--starts`` pairs;
* step: the mean time of a small training step (an MLP on the CPU, torch), measured inside the job
  over ``--steps`` steps after a warm-up, ``--rounds`` pairs of runs. The host's side runs the
  console's Python (3.11.7 here), the container's its image's (Debian's 3.11.2), both torch 2.13.0.

* network: the same container start with the job's own network (``agent.networks.join``: a Podman
  bridge made for it, its address fixed, the node's rules in place) against ``--network none``,
  ``--starts`` pairs; the network's removal after the run is timed apart.

Targets: ≤ 300 ms added to start at the median (Podman's own start here is ~0.3 s), step time
unchanged within the noise (≤ 1 %), ≤ 150 ms added to a start by the job's network.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agent import cgroups, engine, networks
from agent.sandbox import CKPTLIB_ROOT, container_argv, env_file_text, gpu_devices, podman_path, root_tool_env
from bench.stats import quantile

REPO = Path(__file__).resolve().parents[2]
ENGINE_ROOT = Path(os.environ.get("CONTAINER_ENGINE_ROOT", str(REPO / "var" / "podman")))

STEP_SCRIPT = """
import sys, time, torch
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512))
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(64, 512)
steps = int(sys.argv[1])
for i in range(steps + 10):
    if i == 10:
        start = time.perf_counter()
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()
print((time.perf_counter() - start) / steps, flush=True)
"""


def policy(root: Path, image: str) -> dict:
    for name in ("work", "output", "dev"):
        (root / name).mkdir(exist_ok=True)
    for name in ("nvidia0", "nvidia1", "nvidiactl"):
        (root / "dev" / name).touch()
    (root / "env").write_text(env_file_text({"PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": "0"})[0])
    mounts = [[str(root / "work"), "/job/work", "rw"], [str(root / "output"), "/job/output", "rw"], [str(REPO / "ckptlib"), f"{CKPTLIB_ROOT}/ckptlib", "ro"]]
    mounts += [[host, inside, "ro"] for host, inside in gpu_devices([0], device_dir=str(root / "dev"))]
    return {
        "podman": podman_path(),
        "image": image,
        "user": 200000,
        "mounts": mounts,
        "network": "loopback",
        "pids_limit": 4096,
        "engine_env": engine.clean_env(ENGINE_ROOT),
    }


class Cgroup:
    """A run's own cgroup, as the runner makes one: per run, joined before exec, then removed."""

    def __init__(self) -> None:
        self.hierarchy, self.why = cgroups.hierarchy()
        self.enforced, why = cgroups.support()
        self.why = self.why or why
        self.count = 0

    def make(self) -> list[str]:
        if not self.enforced:
            return []
        self.count += 1
        name = f"sac-run-{os.getpid()}{self.count:04d}"  # a run's name: removed everywhere Podman made it
        return [str(d) for d in cgroups.create(self.hierarchy, name, cpus=float(os.cpu_count() or 1), memory_mb=4096)]


RUNS = {"n": 0}
BARE_ENV = {**os.environ, "PATH": f"{Path(sys.prefix) / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"}


def launch(argv: list[str], cwd: Path, cgroup: list[str] | None = None, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        argv,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=(lambda: cgroups.join_self(cgroup)) if cgroup else None,  # noqa: PLW1509 - as agent.runner starts a run
        env=env,
    )


def argv_for(command: str, sandbox: dict | None, cwd: Path, cgroup: list[str]) -> list[str]:
    if not sandbox:
        return ["bash", "-c", command]
    RUNS["n"] += 1
    policy = {**sandbox, "name": f"sac-bench-{os.getpid()}-{RUNS['n']}"}
    parent = cgroups.relative(Path(cgroup[0])) if cgroup else None
    return container_argv(command, policy=policy, env_file=str(cwd.parent / "env"), cgroup_parent=parent, pidfile=str(cwd.parent / "pid"))


def run_once(command: str, sandbox: dict | None, cwd: Path, cg: Cgroup | None, *, first_line: bool) -> tuple[float, str]:
    """Start ``command`` (in the container and a fresh cgroup when given); the seconds to its
    first line (``first_line``) or to its end, and its last line."""
    t0 = time.perf_counter()
    cgroup = cg.make() if (cg and sandbox) else []
    argv = argv_for(command, sandbox, cwd, cgroup)
    if sandbox:
        argv.insert(2, "--rm")
    proc = launch(argv, cwd, cgroup, env=root_tool_env(sandbox["engine_env"]) if sandbox else BARE_ENV)
    if first_line:
        line = proc.stdout.readline()
        elapsed = time.perf_counter() - t0
        proc.communicate()
    else:
        out, _ = proc.communicate()
        elapsed, line = time.perf_counter() - t0, out.strip().splitlines()[-1]
    if cgroup:
        cgroups.remove([Path(d) for d in cgroup])
        cgroups.remove_everywhere(cgroups.relative(Path(cgroup[0])) or "")
    return elapsed, line.decode().strip()


POOL = "10.213.0.0/16"


def run_with_network(command: str, sandbox: dict, cwd: Path, removals: list[float]) -> float:
    """A start as a job's first rank makes it: its network, then its container in it; the seconds
    to the first line. The network's removal (after the run) goes to ``removals``."""
    RUNS["n"] += 1
    name = f"sac-bench-net-{os.getpid()}-{RUNS['n']}"
    env = root_tool_env(sandbox["engine_env"])
    t0 = time.perf_counter()
    net = networks.join(name, rank=0, egress="outbound", pool=POOL, deny=["10.0.0.0/8"], podman=sandbox["podman"], env=env, labels={})
    policy = {**sandbox, "name": name, "network": "job"}
    argv = container_argv(
        command, policy=policy, env_file=str(cwd.parent / "env"), cgroup_parent=None, pidfile=str(cwd.parent / "pid"), network=(net.name, net.address)
    )
    argv.insert(2, "--rm")
    proc = launch(argv, cwd, None, env=env)
    assert proc.stdout is not None
    proc.stdout.readline()
    elapsed = time.perf_counter() - t0
    proc.communicate()
    t1 = time.perf_counter()
    networks.leave(net, podman=sandbox["podman"], env=env)
    removals.append(time.perf_counter() - t1)
    return elapsed


def interleaved(pairs: int, bare, boxed) -> tuple[list[float], list[float]]:
    """``pairs`` samples of each, the order flipping every pair (bare first, then sandbox first)."""
    a, b = [], []
    for i in range(pairs):
        if i % 2 == 0:
            a.append(bare())
            b.append(boxed())
        else:
            b.append(boxed())
            a.append(bare())
    return a, b


def spread(values: list[float], scale: float, unit: str) -> str:
    values = sorted(v * scale for v in values)
    return f"median {quantile(values, 0.5):.1f} {unit}, p95 {quantile(values, 0.95):.1f}, min {values[0]:.1f}, max {values[-1]:.1f} (n={len(values)})"


def report_added(base: tuple[str, list[float]], other: tuple[str, list[float]], *, target: float) -> None:
    """Each side's starts, what ``other`` adds per pair (median against ``target``, seconds), the ratio."""
    (base_name, base_times), (other_name, other_times) = base, other
    width = max(len(base_name), len(other_name))
    print(f"  {base_name:<{width}} {spread(base_times, 1000, 'ms')}")
    print(f"  {other_name:<{width}} {spread(other_times, 1000, 'ms')}")
    added = [y - x for x, y in zip(base_times, other_times, strict=True)]
    median_added = statistics.median(added)
    print(f"  added per pair: {spread(added, 1000, 'ms')}")
    print(f"  added: {median_added * 1000:.1f} ms (median of pairs)  [{'PASS' if median_added <= target else 'FAIL'}: ≤ {target * 1000:.0f} ms]")
    print(f"  ratio {other_name}/{base_name} (medians): {statistics.median(other_times) / statistics.median(base_times):.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=30, help="pairs of starts")
    parser.add_argument("--rounds", type=int, default=6, help="pairs of training runs")
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    ready, why = engine.availability(ENGINE_ROOT)
    if not ready:
        print(f"cannot measure: {why}")
        return 2
    from agent import default_image

    image = default_image.ensure(ENGINE_ROOT, 5000, "pytorch:2.13-py3.11", log=lambda line: None)
    pulled = engine.pull(ENGINE_ROOT, image["alias"])
    if not pulled.ok:
        print(f"cannot measure: {pulled.message}")
        return 2
    reference = image["alias"].rsplit(":", 1)[0] + "@" + pulled.digest
    root = Path(tempfile.mkdtemp(prefix="bench-sandbox-"))
    os.chmod(root, 0o755)
    try:
        sandbox = policy(root, reference)
        cwd = root / "work"
        os.chown(cwd, 200000, 200000)
        cg = Cgroup()
        print(
            f"load before: {os.getloadavg()[0]:.2f} (1 min) on {os.cpu_count()} cores; container side: podman run {reference[:60]}…"
            + (f" + a cgroup {cg.hierarchy.mode} per run" if cg.enforced else f", no cgroup ({cg.why})")
        )
        command = "python -c 'print(1)'"
        bare, boxed = interleaved(
            args.starts,
            lambda: run_once(command, None, cwd, None, first_line=True)[0],
            lambda: run_once(command, sandbox, cwd, cg, first_line=True)[0],
        )
        print(f"Start (Popen → first line of `python -c 'print(1)'`), {args.starts} interleaved pairs:")
        report_added(("bare", bare), ("container", boxed), target=0.3)
        removals: list[float] = []
        loopback, own = interleaved(
            args.starts,
            lambda: run_once(command, sandbox, cwd, None, first_line=True)[0],
            lambda: run_with_network(command, sandbox, cwd, removals),
        )
        print(f"Start with the job's own network (made, joined) vs --network none, {args.starts} interleaved pairs:")
        report_added(("--network none", loopback), ("job network", own), target=0.15)
        print(f"  the network's removal after the run: {spread(removals, 1000, 'ms')}")
        step = f"python -c {shlex.quote(STEP_SCRIPT)} {args.steps}"
        bare_steps, boxed_steps = interleaved(
            args.rounds,
            lambda: float(run_once(step, None, cwd, None, first_line=False)[1]),
            lambda: float(run_once(step, sandbox, cwd, cg, first_line=False)[1]),
        )
        print(f"Training step (MLP 512-1024-512, AdamW, batch 64, 1 thread; {args.steps} steps a run), {args.rounds} interleaved pairs:")
        print(f"  bare     {spread(bare_steps, 1000, 'ms')}")
        print(f"  container {spread(boxed_steps, 1000, 'ms')}")
        ratios = [y / x - 1 for x, y in zip(bare_steps, boxed_steps, strict=True)]
        print(f"  overhead per pair: {spread(ratios, 100, '%')}")
        overhead = statistics.median(ratios)
        print(f"  overhead: {overhead * 100:+.2f} % (median of pairs)  [{'PASS' if overhead <= 0.01 else 'FAIL'}: ≤ 1 %]")
        print(f"load after: {os.getloadavg()[0]:.2f} (1 min)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
