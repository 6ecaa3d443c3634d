"""Every job in a network of its own (agent.networks), tried as a hostile job of a regular user:
its ranks meet, and nothing else of the node answers it — not a loopback service, not the bridge's
gateway, not the node's addresses, not the platform's registry, not another job; the outside world
only where its project's egress is ``outbound``; and the hosts' network never without the
operator's switch, whichever route a job takes to run.

Real jobs on the embedded agent, in their containers; "the internet" is a host the test makes in a
network namespace of its own on a documentation-range address (203.0.113.10).
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from urllib.parse import urlparse

import pytest

from agent import networks
from agent.tests.test_sandbox_network import listening
from harness.node_agent import pump_until
from harness.sandbox import needs_sandbox
from jobs.models import Node
from jobs.statuses import JobStatus
from logs.models import LogLine

pytestmark = [pytest.mark.django_db, pytest.mark.slow, needs_sandbox]

OUTSIDE = "203.0.113.10"
OUTSIDE_PORT = 8080

# Every rank: rendezvous with the other on MASTER_ADDR:MASTER_PORT, then try every target given.
PROBE = r"""
import concurrent.futures, json, os, socket, sys, time
rank, master, port = int(os.environ["RANK"]), os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
world = int(os.environ["WORLD_SIZE"])
if world > 1:
    if rank == 0:
        server = socket.create_server(("0.0.0.0", port)); server.settimeout(60)
        peer, _ = server.accept(); print("rank 0 met", peer.recv(64).decode(), flush=True); peer.close()
    else:
        for _ in range(600):
            try:
                conn = socket.create_connection((master, port), timeout=1); break
            except OSError:
                time.sleep(0.1)
        conn.sendall(b"rank 1"); conn.close(); print("rank 1 met rank 0", flush=True)
gateway = [l.split()[0] for l in open("/etc/hosts") if "host.containers.internal" in l]
def attempt(target):
    host, port = target.rsplit(":", 1)
    host = gateway[0] if host == "GATEWAY" and gateway else host
    try:
        socket.create_connection((host, int(port)), timeout=3).close(); return "connected"
    except OSError as exc:
        return type(exc).__name__
targets = json.loads(sys.argv[1])
with concurrent.futures.ThreadPoolExecutor(32) as pool:
    results = dict(zip(targets, pool.map(attempt, targets)))
print("PROBE", rank, json.dumps(results, sort_keys=True), flush=True)
"""


def node_addresses() -> list[str]:
    """The node's own IPv4 addresses, loopback aside (its job bridges' gateways too)."""
    shown = subprocess.run(["ip", "-4", "-o", "addr", "show"], check=False, capture_output=True, text=True).stdout
    return sorted({line.split()[3].split("/")[0] for line in shown.splitlines() if " lo " not in line})


def probes(job) -> dict[int, dict[str, str]]:
    found = {}
    for text in LogLine.objects.filter(job=job).values_list("text", flat=True):
        if text.startswith("PROBE "):
            _, rank, payload = text.split(" ", 2)
            found[int(rank)] = json.loads(payload)
    return found


def probe_command(targets: list[str]) -> str:
    return "python -c " + shlex.quote(PROBE) + " " + shlex.quote(json.dumps(targets))


@pytest.fixture
def node_services(live_server, settings) -> list[str]:
    """What a hostile job tries: the node's services on loopback, on the bridge's gateway and on
    every address of the node (the console, its registry, PostgreSQL and Redis where they run)."""
    ports = [urlparse(live_server.url).port, settings.LOCAL_REGISTRY_PORT] + [p for p in (5432, 6379) if listening(p)]
    hosts = ["127.0.0.1", "GATEWAY", *node_addresses()]
    return [f"{host}:{port}" for host in hosts for port in ports]


@pytest.fixture
def outside_host():
    """A host outside the node: a network namespace on 203.0.113.10 behind a veth pair, serving
    HTTP; the node routes to it as it would to the internet."""
    if not shutil.which("ip"):
        pytest.skip("iproute2 is not installed")
    ns, veth = "satrain-test-inet", "sat-inet0"
    subprocess.run(["ip", "link", "del", veth], check=False, capture_output=True)  # one end takes the other with it
    subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
    steps = [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns],
        ["ip", "addr", "add", "198.51.100.1/30", "dev", veth],
        ["ip", "link", "set", veth, "up"],
        ["ip", "-n", ns, "addr", "add", "198.51.100.2/30", "dev", "eth0"],
        ["ip", "-n", ns, "addr", "add", f"{OUTSIDE}/32", "dev", "lo"],
        ["ip", "-n", ns, "link", "set", "eth0", "up"],
        ["ip", "-n", ns, "link", "set", "lo", "up"],
        ["ip", "-n", ns, "route", "add", "default", "via", "198.51.100.1"],
        ["ip", "route", "replace", f"{OUTSIDE}/32", "via", "198.51.100.2"],
    ]
    for step in steps:
        subprocess.run(step, check=True, capture_output=True)
    server = subprocess.Popen(
        ["ip", "netns", "exec", ns, "python3", "-m", "http.server", "--bind", OUTSIDE, str(OUTSIDE_PORT)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            if (
                subprocess.run(
                    ["ip", "netns", "exec", ns, "python3", "-c", f"import socket; socket.create_connection(('{OUTSIDE}', {OUTSIDE_PORT}), 1)"],
                    check=False,
                    capture_output=True,
                ).returncode
                == 0
            ):
                break
            time.sleep(0.1)
        yield f"{OUTSIDE}:{OUTSIDE_PORT}"
    finally:
        server.kill()
        server.wait()
        subprocess.run(["ip", "route", "del", f"{OUTSIDE}/32"], check=False, capture_output=True)
        subprocess.run(["ip", "link", "del", veth], check=False, capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


@pytest.mark.parametrize("host_network_switch", [True, False], ids=["switch-on", "switch-off"])
def test_a_multi_node_job_reaches_its_other_rank_and_nothing_on_the_node(make_job, drive, project, node_services, host_network_switch):
    project.multi_node_host_network = host_network_switch  # ranks on one host never use the host's network
    project.save()
    job = drive(make_job(command=probe_command(node_services), node_count=2, gpus_per_node=0), {JobStatus.COMPLETED, JobStatus.FAILED}, timeout=120)
    lines = set(LogLine.objects.filter(job=job).values_list("text", flat=True))
    assert job.status == JobStatus.COMPLETED, (job.status_reason, sorted(lines)[-20:])
    assert {"rank 0 met rank 1", "rank 1 met rank 0"} <= lines
    seen = probes(job)
    assert set(seen) == {0, 1}
    for rank in (0, 1):
        reached = {target: result for target, result in seen[rank].items() if result == "connected"}
        assert reached == {}, f"rank {rank} reached the node's {sorted(reached)}"


def test_the_platforms_registry_refuses_an_anonymous_upload(default_image, settings):
    request = urllib.request.Request(f"http://127.0.0.1:{settings.LOCAL_REGISTRY_PORT}/v2/pytorch/blobs/uploads/", method="POST", data=b"")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code in (401, 403)


def test_a_job_reaches_the_outside_world_only_with_outbound_egress(make_job, drive, project, outside_host):
    reached = {}
    for egress in ("outbound", "none"):
        project.egress = egress
        project.save()
        job = drive(make_job(name=f"egress-{egress}", command=probe_command([outside_host]), gpus_per_node=0), JobStatus.COMPLETED, timeout=90)
        reached[egress] = probes(job)[0][outside_host]
    assert reached == {"outbound": "connected", "none": reached["none"]} and reached["none"] != "connected"


def test_an_outbound_job_never_reaches_the_private_ranges_the_operator_denies(make_job, drive, project, outside_host, settings):
    settings.JOB_EGRESS_DENY = "203.0.113.0/24"
    project.egress = "outbound"
    project.save()
    # The node's table follows the settings an agent starts with.
    networks.ensure_rules(settings.JOB_NETWORK_POOL, [settings.JOB_EGRESS_DENY], {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, replace=True)
    try:
        job = drive(make_job(command=probe_command([outside_host]), gpus_per_node=0), JobStatus.COMPLETED, timeout=90)
        assert probes(job)[0][outside_host] != "connected"
    finally:
        networks.ensure_rules(settings.JOB_NETWORK_POOL, ["10.0.0.0/8"], {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, replace=True)


SERVE = r"""
import os, socket
server = socket.create_server(("0.0.0.0", 7000))
print("SERVING", os.environ["MASTER_ADDR"], flush=True)
server.settimeout(40)
try:
    peer, _ = server.accept(); print("ANOTHER JOB GOT IN", flush=True)
except OSError:
    print("nobody came", flush=True)
"""


def test_a_job_never_reaches_another_jobs_network(make_job, drive, agent):
    first = make_job(name="listener", command="python -c " + shlex.quote(SERVE), gpus_per_node=0)

    def serving() -> str | None:
        line = LogLine.objects.filter(job=first, text__startswith="SERVING ").values_list("text", flat=True).first()
        return line.split()[1] if line else None

    address = pump_until(agent, serving, "the listener started", timeout=60)
    second = drive(make_job(name="intruder", command=probe_command([f"{address}:7000"]), gpus_per_node=0), JobStatus.COMPLETED, timeout=60)
    assert probes(second)[0][f"{address}:7000"] != "connected"


def test_a_job_cannot_make_a_user_namespace(make_job, drive):
    job = drive(make_job(command="unshare -Ur true; echo unshare-exit=$?; unshare -n true; echo netns-exit=$?", gpus_per_node=0), JobStatus.COMPLETED)
    lines = list(LogLine.objects.filter(job=job).values_list("text", flat=True))
    assert "unshare-exit=1" in lines and "netns-exit=1" in lines, lines[-6:]


def test_ranks_on_different_hosts_run_only_with_the_operators_switch(make_job, drive, project):
    """A job queued while the switch was on, whose ranks land on two hosts after the operator
    turned it off, is refused where its ranks start: the settings of now hold for every job."""
    Node.objects.filter(name="node-b").update(agent="nodeagent@another-host")
    Node.objects.filter(name="node-c").update(agent="nodeagent@a-third-host")
    project.multi_node_host_network = True
    project.save()
    job = make_job(command="echo ran", node_count=2, gpus_per_node=0)
    project.multi_node_host_network = False
    project.save()
    job = drive(job, {JobStatus.FAILED, JobStatus.COMPLETED}, timeout=60)
    assert job.status == JobStatus.FAILED
    assert "different hosts" in job.status_reason and project.name in job.status_reason
    assert not LogLine.objects.filter(job=job, text="ran").exists()
