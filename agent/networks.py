"""A network of its own for every job: a Podman bridge per attempt, shared by the attempt's ranks
on this host, and the node's netfilter rules that keep every job network away from the node.

Standard library only: the runner (``agent.runner``) creates the network before its container
starts and removes it after (the last rank's runner succeeds; Podman refuses while another rank's
container is attached). What holds, whatever a job does inside its network namespace (it has no
capability to change its own routes or addresses):

* **its own ranks**: each rank has a fixed address in the network's subnet (the subnet's
  ``.2 + rank``), so ``MASTER_ADDR`` names rank 0 before any rank starts;
* **never the node**: netfilter's input hook drops every packet from the job networks' pool to the
  node itself (its loopback services are not routable from a bridge; its addresses, the bridge's
  gateway and the other interfaces' addresses all arrive here), and IPv6 is off in the container;
* **never another job's network**: traffic between two job subnets is dropped; a subnet pair is
  let through only for the same network (``same_job``, with the bridge netfilter the node has);
* **the outside world only with ``outbound`` egress**: a ``none`` network is Podman's
  ``--internal`` bridge (no gateway, no route out); an ``outbound`` one is NAT'ed out, except to
  the operator's denied ranges (private and link-local by default: the cluster, a cloud's metadata
  service) and always except to the node; the node's resolvers stay reachable on port 53 (a job's
  ``/etc/resolv.conf`` names them).
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import subprocess
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

TABLE = "satrain_jobs"
LOCK_PATH = Path("/run/satrain-jobs-netfilter.lock")
SUBNET_PREFIX = 26  # 61 ranks on one host
RESOLV_FILES = ("/etc/resolv.conf", "/run/systemd/resolve/resolv.conf")
TOOL_TIMEOUT = 30


class NetworkUnavailable(Exception):
    """The job's network could not be made: the run does not start without it."""


@dataclass(frozen=True)
class JobNetwork:
    """What the runner's container joins: the network's name, its address and rank 0's."""

    name: str
    address: str
    master_addr: str
    subnet: str


def _run(argv: Sequence[str], env: Mapping[str, str], *, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), check=False, env=dict(env), input=stdin, capture_output=True, text=True, timeout=TOOL_TIMEOUT)


def _subnets(pool: str) -> list[ipaddress.IPv4Network]:
    network = ipaddress.ip_network(pool, strict=False)
    if not isinstance(network, ipaddress.IPv4Network) or network.prefixlen > SUBNET_PREFIX:
        raise NetworkUnavailable(f"JOB_NETWORK_POOL {pool} must be an IPv4 range of /{SUBNET_PREFIX} or larger")
    return list(network.subnets(new_prefix=SUBNET_PREFIX))


def resolvers() -> list[str]:
    """The node's own DNS servers a job's ``/etc/resolv.conf`` names (not loopback ones: Podman
    replaces those with the upstream servers, listed in systemd-resolved's file)."""
    found: list[str] = []
    for path in RESOLV_FILES:
        try:
            text = Path(path).read_text(errors="replace")[:65536]
        except OSError:
            continue
        for line in text.splitlines():
            fields = line.split()
            if len(fields) >= 2 and fields[0] == "nameserver":
                try:
                    address = ipaddress.ip_address(fields[1].split("%")[0])
                except ValueError:
                    continue
                if address.version == 4 and not address.is_loopback and str(address) not in found:
                    found.append(str(address))
    return found


def ruleset(pool: str, deny: Sequence[str]) -> str:
    """The node's table (``nft -f``): one per node, whatever the number of consoles on it."""
    denied = [str(ipaddress.ip_network(d, strict=False)) for d in deny if ipaddress.ip_network(d, strict=False).version == 4]
    elements = lambda items: ("elements = { " + ", ".join(items) + " }") if items else ""  # noqa: E731
    return f"""table inet {TABLE} {{
  set same_job {{ type ipv4_addr . ipv4_addr; flags interval; }}
  set denied {{ type ipv4_addr; flags interval; auto-merge; {elements(denied)} }}
  set resolvers {{ type ipv4_addr; {elements(resolvers())} }}
  chain input {{
    type filter hook input priority filter - 10; policy accept;
    ip saddr {pool} drop
  }}
  chain forward {{
    type filter hook forward priority filter - 10; policy accept;
    ip saddr {pool} ip saddr . ip daddr @same_job accept
    ip saddr {pool} ip daddr {pool} drop
    ip daddr {pool} ip saddr {pool} drop
    ip saddr {pool} ip daddr @resolvers th dport 53 accept
    ip saddr {pool} ip daddr @denied drop
  }}
}}
"""


def ensure_rules(pool: str, deny: Sequence[str], env: Mapping[str, str], *, replace: bool = False) -> None:
    """Install the node's table once (``replace``: an agent's start, with today's settings; its
    ``same_job`` elements are kept)."""
    LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK_PATH, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        listed = _run(["nft", "-j", "list", "set", "inet", TABLE, "same_job"], env)
        if listed.returncode == 0 and not replace:
            return
        kept = _same_job_elements(listed.stdout) if listed.returncode == 0 else []
        text = ruleset(pool, deny)
        if listed.returncode == 0:
            text = f"delete table inet {TABLE}\n" + text
        if kept:
            text += f"add element inet {TABLE} same_job {{ {', '.join(kept)} }}\n"
        done = _run(["nft", "-f", "-"], env, stdin=text)
        if done.returncode != 0:
            raise NetworkUnavailable(f"the node's job network rules could not be installed: {done.stderr.strip()[:300]}")


def _same_job_elements(listing: str) -> list[str]:
    try:
        items = json.loads(listing)["nftables"]
    except (ValueError, KeyError, TypeError):
        return []
    kept = []
    for item in items:
        for element in (item.get("set") or {}).get("elem", []) if isinstance(item, dict) else []:
            try:
                left, right = element["concat"]
                kept.append(f"{left['prefix']['addr']}/{left['prefix']['len']} . {right['prefix']['addr']}/{right['prefix']['len']}")
            except (KeyError, TypeError, ValueError):
                continue
    return kept


def join(name: str, *, rank: int, egress: str, pool: str, deny: Sequence[str], podman: str, env: Mapping[str, str], labels: Mapping[str, object]) -> JobNetwork:
    """The attempt's network, made by the first of its ranks to start (the others find it)."""
    ensure_rules(pool, deny, env)
    subnets = _subnets(pool)
    start = zlib.crc32(name.encode()) % len(subnets)
    subnet = None
    for step in range(len(subnets)):
        candidate = subnets[(start + step) % len(subnets)]
        argv = [podman, "network", "create", "--disable-dns", "--subnet", str(candidate)]
        if egress != "outbound":
            argv.append("--internal")
        for key, value in sorted(labels.items()):
            argv += ["--label", f"{key}={value}"]
        made = _run([*argv, name], env)
        if made.returncode == 0:
            subnet = candidate
            break
        if "already used" in made.stderr and "subnet" in made.stderr:
            continue  # another network (a job's, or the node's) holds it: the next one
        if "already exists" in made.stderr or "already used" in made.stderr:
            subnet = _subnet_of(name, podman, env)
            break
        raise NetworkUnavailable(f"the job's network could not be made: {made.stderr.strip()[:300]}")
    if subnet is None:
        raise NetworkUnavailable(f"no free /{SUBNET_PREFIX} left in JOB_NETWORK_POOL {pool}")
    pair = f"{subnet} . {subnet}"
    added = _run(["nft", "add", "element", "inet", TABLE, "same_job", "{ " + pair + " }"], env)
    if added.returncode != 0:
        raise NetworkUnavailable(f"the job's network could not be opened to its own ranks: {added.stderr.strip()[:300]}")
    hosts = list(subnet.hosts())
    if rank + 1 >= len(hosts):
        raise NetworkUnavailable(f"a job network holds at most {len(hosts) - 1} ranks on one host")
    return JobNetwork(name=name, address=str(hosts[rank + 1]), master_addr=str(hosts[1]), subnet=str(subnet))


def _subnet_of(name: str, podman: str, env: Mapping[str, str]) -> ipaddress.IPv4Network:
    shown = _run([podman, "network", "inspect", "--format", "{{range .Subnets}}{{.Subnet}} {{end}}", name], env)
    try:
        network = ipaddress.ip_network(shown.stdout.split()[0])
    except (IndexError, ValueError) as exc:
        raise NetworkUnavailable(f"the job's network {name} has no subnet: {shown.stderr.strip()[:300]}") from exc
    if not isinstance(network, ipaddress.IPv4Network):
        raise NetworkUnavailable(f"the job's network {name} is not IPv4")
    return network


def leave(network: JobNetwork, *, podman: str, env: Mapping[str, str]) -> bool:
    """Remove the attempt's network once its last container is gone (Podman refuses while one is
    attached: another rank still runs). Returns whether it was removed."""
    removed = _run([podman, "network", "rm", network.name], env)
    if removed.returncode != 0:
        return False
    pair = f"{network.subnet} . {network.subnet}"
    _run(["nft", "delete", "element", "inet", TABLE, "same_job", "{ " + pair + " }"], env)
    return True


def remove_unused(name: str, *, podman: str, env: Mapping[str, str]) -> bool:
    """Remove a job network no container is in (an agent's start sweeps those its runs left)."""
    try:
        subnet = _subnet_of(name, podman, env)
    except NetworkUnavailable:
        return False
    return leave(JobNetwork(name=name, address="", master_addr="", subnet=str(subnet)), podman=podman, env=env)
