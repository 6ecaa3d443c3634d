"""A regular user's jobs attack the node from inside their containers (real Podman, the local
registry's default image, the embedded agent as root): each attempt changes nothing beyond the
job's own directories, and each ends with a reason the user can read."""

from __future__ import annotations

import json
import os
import shlex
import stat
import time
from pathlib import Path

import psutil
import pytest
from django.conf import settings

from agent import uids
from harness.job_factory import job_output
from harness.node_agent import pump_until
from harness.sandbox import needs_sandbox
from jobs.models import AttemptNode
from jobs.services.paths import project_root
from jobs.statuses import JobStatus

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, needs_sandbox]

SOCKET_WALK = r"""
import os, socket, stat
skip = ("/proc", "/sys")
found, answered = [], []
for top, dirs, files in os.walk("/", onerror=lambda e: None):
    dirs[:] = [d for d in dirs if os.path.join(top, d) not in skip]
    for name in dirs + files:
        path = os.path.join(top, name)
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            continue
        if stat.S_ISSOCK(mode):
            found.append(path)
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(1)
            try:
                s.connect(path)
                answered.append(path)
            except OSError:
                pass
            s.close()
for path in EXTRA:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        answered.append(path)
    except OSError as exc:
        print("refused", path, type(exc).__name__, flush=True)
print("sockets", found, flush=True)
print("answered", answered, flush=True)
"""


def test_no_unix_socket_of_the_host_answers_a_job(make_job, drive):
    # PostgreSQL's and MariaDB's sockets exist on this machine; the console's own live socket too.
    host_sockets = [p for p in ("/run/postgresql/.s.PGSQL.5432", "/run/mysqld/mysqld.sock", str(settings.VAR_DIR / "live.sock")) if os.path.exists(p)]
    script = SOCKET_WALK.replace("EXTRA", repr(host_sockets))
    job = drive(make_job(command="python -c " + shlex.quote(script)), JobStatus.COMPLETED, timeout=120)
    out = job_output(job)
    assert "answered []" in out, out
    sockets = next(line for line in out if line.startswith("sockets"))
    assert sockets == "sockets []", sockets
    assert sum(line.startswith("refused") for line in out) == len(host_sockets)


def test_host_files_are_absent_from_a_job(make_job, drive):
    victim = drive(make_job(name="victim", command="sleep 60"), JobStatus.RUNNING)
    part = AttemptNode.objects.select_related("attempt").get(attempt__job=victim)
    paths = [
        settings.VAR_DIR / "secret_key",
        settings.VAR_DIR,
        settings.JOB_WORK_ROOT,
        Path(settings.JOB_WORK_ROOT) / str(victim.pk),
        Path(part.workdir),
        settings.BASE_DIR / "manage.py",
        "/etc/postgresql",
        "/root",
        "/var/lib/postgresql",
    ]
    script = "import os, sys\nfor p in sys.argv[1:]:\n    print(p, os.path.exists(p), flush=True)"
    job = drive(make_job(command="python -c " + shlex.quote(script) + " " + " ".join(shlex.quote(str(p)) for p in paths)), JobStatus.COMPLETED, timeout=60)
    out = job_output(job)
    assert out == [f"{p} {p == '/root'}" for p in map(str, paths)], out  # the image's own /root only


FLIPPER = r"""
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
RENAME_EXCHANGE = 2
out = os.environ["OUTPUT_DIR"]
os.makedirs(out + "/x", exist_ok=True)
for target, link in (("/", "root"), ("/etc", "etc")):
    try:
        os.symlink(target, out + "/" + link)
    except FileExistsError:
        pass
print("flipping", flush=True)
end = time.time() + DURATION
n = 0
while time.time() < end:
    for link in ("root", "etc"):
        libc.renameat2(-100, (out + "/x").encode(), -100, (out + "/" + link).encode(), RENAME_EXCHANGE)
        n += 1
print("flips", n, flush=True)
"""


def test_a_rename_exchange_flipper_never_redirects_another_launch(make_job, drive, agent, project, client, owner):
    """A job flips its own output directory's entries with symlinks to / and /etc while 20 more
    jobs of the same user launch: those nested in the attacker's directory are refused with a
    reason, the others run in their own directories, nothing else changes owner."""
    from agent.loop import embedded_round

    root = project_root(project)
    drive(make_job(name="flipper", output_dir="att", command="python -c " + shlex.quote(FLIPPER.replace("DURATION", "25"))), JobStatus.RUNNING)
    etc_before = {p: os.lstat(p).st_uid for p in ("/etc", "/etc/passwd", "/etc/shadow", str(root))}
    client.force_login(owner)
    victims = []
    refused_at_create = 0
    for i in range(20):
        output_dir = "att/x" if i % 2 else f"out-{i}"
        response = client.post(
            "/api/v1/training-jobs/",
            {
                "name": f"victim-{i}",
                "image": settings.DEFAULT_IMAGE,
                "command": "ls -la $OUTPUT_DIR; touch $OUTPUT_DIR/mine",
                "gpus_per_node": 0,
                "output_dir": output_dir,
            },
            content_type="application/json",
        )
        if output_dir == "att/x" and response.status_code == 400:
            # Refused at once while the flipper has a link there (the launch would refuse it too).
            assert "symbolic link" in response.json()["output_dir"][0], response.content
            refused_at_create += 1
            continue
        assert response.status_code == 201, response.content
        victims.append((response.json()["id"], output_dir))
    from jobs.models import TrainingJob

    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        embedded_round(agent)
        statuses = dict(TrainingJob.objects.filter(pk__in=[v for v, _ in victims]).values_list("pk", "status"))
        if all(s in (JobStatus.COMPLETED, JobStatus.FAILED) for s in statuses.values()):
            break
        time.sleep(0.2)
    for job_id, output_dir in victims:
        job = TrainingJob.objects.get(pk=job_id)
        if output_dir == "att/x":
            assert job.status == JobStatus.FAILED, (job.status, job.status_reason)
            assert any(why in job.status_reason for why in ("belongs to a job", "not a plain directory", "symbolic link")), job.status_reason
        else:
            assert job.status == JobStatus.COMPLETED, (job.status, job.status_reason)
            mine = root / output_dir / "mine"
            assert mine.exists() and not mine.is_symlink()
    assert len(victims) + refused_at_create == 20
    assert sum(1 for _, d in victims if d != "att/x") == 10
    assert {p: os.lstat(p).st_uid for p in etc_before} == etc_before
    assert not Path("/mine").exists() and not Path("/etc/mine").exists()


def test_a_fork_bomb_ends_at_the_pid_limit_with_a_reason_that_says_so(make_job, drive, settings):
    settings.JOB_PIDS_LIMIT = 200
    job = drive(make_job(command="while true; do sleep 600 & done", failover_enabled=True), {JobStatus.FAILED, JobStatus.INTERNAL_ERROR}, timeout=120)
    assert "PID limit reached" in job.status_reason and "200 processes" in job.status_reason, job.status_reason


def test_a_huge_line_keeps_the_runner_small(make_job, drive, agent):
    # 256 MiB without a newline: a runner that held the line would grow past it, far over the bound.
    script = "import sys\nchunk = 'x' * 2**20\nfor _ in range(256):\n    sys.stdout.write(chunk)\nsys.stdout.write('\\nend\\n')"
    job = drive(make_job(command="python -c " + shlex.quote(script)), JobStatus.RUNNING, timeout=60)
    part = AttemptNode.objects.get(attempt__job=job)
    runner = psutil.Process(part.runner_pid)
    peak = 0
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        try:
            if runner.status() == psutil.STATUS_ZOMBIE:
                break
            peak = max(peak, runner.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    job = drive(job, JobStatus.COMPLETED, timeout=120)
    out = job_output(job)
    assert peak < 100 * 2**20, f"the runner grew to {peak / 2**20:.0f} MiB"
    assert out[-1] == "end"
    assert out[0].endswith(f"…[line cut at {settings.LOG_MAX_LINE_CHARS} characters]")
    assert len(out[0]) < settings.LOG_MAX_LINE_CHARS + 100


def test_loader_variables_of_a_job_reach_only_its_container(make_job, drive, agent):
    env = {"GCONV_PATH": "/tmp/evil", "GLIBC_TUNABLES": "glibc.malloc.check=3", "MALLOC_CHECK_": "3"}
    job = drive(make_job(command="echo $GCONV_PATH $GLIBC_TUNABLES $MALLOC_CHECK_; sleep 30", env=env), JobStatus.RUNNING)
    part = AttemptNode.objects.get(attempt__job=job)
    pump_until(agent, lambda: job_output(job), "the job's first line", timeout=30)
    root_processes = [psutil.Process(part.runner_pid), *psutil.Process(part.runner_pid).children(recursive=True)]
    checked = 0
    for process in root_processes:
        try:
            if process.uids().effective != 0:
                continue  # the job's own processes, in its container
            environ = process.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        checked += 1
        assert not set(env) & set(environ), (process.name(), sorted(set(env) & set(environ)))
    assert checked >= 2  # the runner and podman at least
    assert job_output(job)[0] == "/tmp/evil glibc.malloc.check=3 3"


def test_two_consoles_on_one_node_never_share_a_uid(tmp_path):
    registry = tmp_path / "uids.json"
    first = [uids.uid_for(registry, "install-a", project, "200000-200099") for project in range(1, 11)]
    second = [uids.uid_for(registry, "install-b", project, "200000-200099") for project in range(1, 11)]
    assert len(set(first) | set(second)) == 20
    assert uids.uid_for(registry, "install-a", 3, "200000-200099") == first[2]  # stable
    assert json.loads(registry.read_text())["install-b/1"] == second[0]
    assert stat.S_IMODE(registry.stat().st_mode) == 0o644


FIFO_JOB = r"""
set -e
root="$OUTPUT_DIR/concurrent_checkpoint"
mkdir -p "$root/checkpoint-5"
echo '{}' > "$root/checkpoint-5/ckptlib.json"
mkfifo "$root/latest"
echo "[Concurrent Checkpoint] committed step=5 bytes=10 blocking_s=0.000100 persist_s=0.000200 path=$root/checkpoint-5"
sleep 600
"""


def test_a_fifo_for_a_checkpoint_marker_costs_only_its_own_job(make_job, drive, agent, outsider):
    """A job makes ckptlib's ``latest`` marker a FIFO and fails over: the agent, reading the
    marker as root for the resume step, neither blocks nor follows it; another user's job runs
    and logs meanwhile."""
    from agent.loop import embedded_round
    from failover.services.faults import inject_fault

    job = drive(make_job(name="fifo", command=FIFO_JOB), JobStatus.RUNNING, timeout=120)
    pump_until(agent, lambda: any("committed step=5" in line for line in job_output(job)), "committed step=5", timeout=60)
    part = AttemptNode.objects.get(attempt__job=job)
    inject_fault(part.node, gpu=part.gpu_indices[0], xid=79, actor="test")
    other = make_job(name="neighbour", owner=outsider, command="for i in 1 2 3; do echo tick $i; done", gpus_per_node=0)
    started = time.monotonic()
    from jobs.models import JobAttempt

    # A round that opened the FIFO would never return (nobody writes it): the rounds returning,
    # the neighbour completing and the failover starting are what shows it. How long a round
    # takes is the benchmarks' business.
    while time.monotonic() - started < 90:
        embedded_round(agent)
        job.refresh_from_db()
        other.refresh_from_db()
        if other.status == JobStatus.COMPLETED and JobAttempt.objects.filter(job=job, number=2, started_at__isnull=False).exists():
            break
        time.sleep(0.1)
    assert other.status == JobStatus.COMPLETED and job_output(other) == ["tick 1", "tick 2", "tick 3"]
    second = JobAttempt.objects.get(job=job, number=2)
    assert second.resume_step == 5  # the listing's answer: the FIFO counts as no marker
