"""A job's container has a network of its own: nothing of the node is reachable (the console, its
PostgreSQL and Redis on 127.0.0.1), while the processes of one run still meet on localhost and
the ranks of a multi-node job meet on their job network (agent.networks; the rest of what a job
network reaches: test_job_networks.py).

Real jobs on the embedded agent, in their containers.
"""

from __future__ import annotations

import shlex
import socket
from pathlib import Path
from urllib.parse import urlparse

import pytest

from harness.sandbox import needs_sandbox
from jobs.statuses import JobStatus
from logs.models import LogLine

pytestmark = [pytest.mark.django_db, pytest.mark.slow, needs_sandbox]

CONNECT = """
import socket, sys
for port in sys.argv[1:]:
    try:
        socket.create_connection(("127.0.0.1", int(port)), timeout=3).close()
        print(port, "-> connected", flush=True)
    except OSError as exc:
        print(port, "->", type(exc).__name__, flush=True)
"""


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def printed(job) -> dict[str, str]:
    lines = LogLine.objects.filter(job=job).order_by("seq").values_list("text", flat=True)
    return dict(line.split(" -> ", 1) for line in lines if " -> " in line)


def test_a_single_node_job_reaches_nothing_on_the_node(make_job, drive, live_server):
    console_port = urlparse(live_server.url).port
    ports = [console_port] + [p for p in (5432, 6379) if listening(p)]
    assert listening(console_port)  # reachable from the node itself: the sandbox is what stops the job
    job = make_job(command="python -c " + shlex.quote(CONNECT) + " " + " ".join(map(str, ports)))
    job = drive(job, JobStatus.COMPLETED, timeout=60)
    assert printed(job) == {str(p): "ConnectionRefusedError" for p in ports}


def test_the_processes_of_one_run_meet_on_localhost(make_job, drive, settings):
    probe = Path(__file__).with_name("dist_probe.py")
    settings.JOB_VOLUMES = f"{probe.parent}:ro"  # the job's code, as a project volume
    command = f"python -m torch.distributed.run --nnodes=1 --nproc_per_node=2 --master_addr=127.0.0.1 --master_port=$MASTER_PORT {probe}"
    job = drive(make_job(command=command, gpus_per_node=2), {JobStatus.COMPLETED, JobStatus.FAILED}, timeout=240)
    lines = list(LogLine.objects.filter(job=job).values_list("text", flat=True))
    assert job.status == JobStatus.COMPLETED, (job.status_reason, lines[-20:])
    workers = sorted(line for line in lines if line.startswith("worker "))
    assert workers == ["worker 0 of 2 sum 3 on 127.0.0.1", "worker 1 of 2 sum 3 on 127.0.0.1"]


RENDEZVOUS = """
import os, socket, time
addr, port, rank = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["RANK"])
if rank == 0:
    server = socket.create_server((addr, port))
    server.settimeout(30)
    peer, _ = server.accept()
    print("master got", peer.recv(64).decode(), flush=True)
else:
    for _ in range(300):
        try:
            conn = socket.create_connection((addr, port), timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    conn.sendall(b"hello from rank 1")
    print("worker reached the master", flush=True)
"""


def test_a_multi_node_job_reaches_its_master(make_job, drive):
    job = drive(make_job(command="python -c " + shlex.quote(RENDEZVOUS), node_count=2), {JobStatus.COMPLETED, JobStatus.FAILED}, timeout=90)
    lines = set(LogLine.objects.filter(job=job).values_list("text", flat=True))
    assert job.status == JobStatus.COMPLETED, (job.status_reason, lines)
    assert {"master got hello from rank 1", "worker reached the master"} <= lines


ACCELERATE_SCRIPT = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")  # accelerate launch started the ranks (RANK, WORLD_SIZE, MASTER_ADDR)
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
# One write a line: both ranks share the container's stdout, and print's text and newline are two writes.
os.write(1, f"accelerate process {dist.get_rank()} of {dist.get_world_size()} sum {int(t.item())}\\n".encode())
# Leave the group before exiting: a rank that exits while its peer's gloo pair is still open can make
# that peer fail with "Connection closed by peer" (a known gloo exit race, the likeliest cause of the
# one CI failure of this test; the failing rank's error was not kept then, the assertion shows it now).
dist.destroy_process_group()
"""


def test_an_accelerate_job_with_two_processes_completes(make_job, drive):
    script = "cat > probe.py <<'PY'\n" + ACCELERATE_SCRIPT + "PY\n"
    command = (
        script
        + "accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no --dynamo_backend no --main_process_port $MASTER_PORT probe.py"
    )
    job = drive(make_job(command=command, gpus_per_node=2), {JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.INTERNAL_ERROR}, timeout=240)
    lines = list(LogLine.objects.filter(job=job).order_by("seq").values_list("text", flat=True))
    errors = [line for line in lines if "Error" in line or "error:" in line]  # the rank's own cause, above torchrun's summary
    assert job.status == JobStatus.COMPLETED, (job.status_reason, errors[:20], lines[-20:])
    assert sorted(line for line in lines if line.startswith("accelerate process")) == ["accelerate process 0 of 2 sum 3", "accelerate process 1 of 2 sum 3"]
