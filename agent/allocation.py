"""What a run started by a cluster's scheduler (Slurm) follows: the allocation Slurm gave it,
which may not be where the console's placement held (``agent.runner`` calls ``follow``).

* its GPUs (``SLURM_JOB_GPUS``): ``CUDA_VISIBLE_DEVICES`` and the container's GPU devices move
  index for index;
* its node (``SLURMD_NODENAME``): the container's host name and a simulated node's stand-in
  devices are that node's;
* ``MASTER_ADDR``: the allocation's first node (``SLURM_LAUNCH_NODE_IPADDR``, the node running the
  batch script, where ``srun`` started the ranks together), this node for one rank;
* Slurm's own ``SLURM_*`` names about the job, as a batch script there sees them (never over the
  run's own), and the container's label the cluster's Epilog finds it by.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from agent.sandbox import ContainerPolicy

SLURM_JOB_LABEL = "io.satrain.slurm-job"
_GPU_NAME = re.compile(r"(nvidia(?:\.com/gpu=)?)(\d+)$")


def index_list(text: str) -> list[int]:
    """GPU indices as Slurm lists them: "0,1", "0-2,5"."""
    indices: list[int] = []
    for piece in text.split(","):
        low, _, high = piece.strip().partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            indices += range(int(low), int(high or low) + 1)
    return indices


def follow_scheduler_gpus(
    env: dict[str, str], policy: ContainerPolicy | None, slurm_gpus: str
) -> tuple[dict[str, str], ContainerPolicy | None, tuple[int, ...]] | None:
    """The run uses the GPUs Slurm allocated (``SLURM_JOB_GPUS``), which may not be the ones the
    console placed it on (the cluster's other work holds those): its ``CUDA_VISIBLE_DEVICES`` and
    its container's GPU devices are moved index for index. Returns (env, policy, the indices), or
    None where nothing moves."""
    given = index_list(slurm_gpus)
    placed = index_list(env.get("CUDA_VISIBLE_DEVICES", ""))
    if not given or not placed or given == placed or len(given) != len(placed):
        return None
    moves = dict(zip(placed, given, strict=True))

    def moved(path: str) -> str:
        found = _GPU_NAME.search(path)
        if found is None or int(found.group(2)) not in moves:
            return path
        return path[: found.start(2)] + str(moves[int(found.group(2))])

    if policy:
        policy = policy.copy()
        policy["devices"] = [(moved(host), moved(inside)) for host, inside in policy.get("devices") or []]
        policy["mounts"] = [
            [moved(host), moved(inside), mode] if inside.startswith("/dev/nvidia") else [host, inside, mode]
            for host, inside, mode in policy.get("mounts") or []
        ]
    return {**env, "CUDA_VISIBLE_DEVICES": ",".join(map(str, given))}, policy, tuple(given)


def follow_scheduler_node(policy: ContainerPolicy, node: str) -> ContainerPolicy:
    """The run is on the node Slurm chose (``SLURMD_NODENAME``), which may not be the one the
    console placed it on: its container is named for that node, and a simulated node's stand-in
    GPU devices are that node's (``SIMULATED_DEVICE_DIR/<node>/``)."""
    placed = str(policy.get("hostname") or "")
    if not placed or placed == node:
        return policy
    policy = policy.copy()
    policy["hostname"] = node
    policy["mounts"] = [
        [host.replace(f"/{placed}/", f"/{node}/") if inside.startswith("/dev/nvidia") else host, inside, mode]
        for host, inside, mode in policy.get("mounts") or []
    ]
    return policy


@dataclass(frozen=True)
class Placed:
    """The run's environment and container as Slurm placed it, and where (for its pid record)."""

    env: dict[str, str]
    policy: ContainerPolicy | None
    gpus: tuple[int, ...] | None  # None: the GPUs placement held
    node: str | None  # None: not named by Slurm


def follow(env: dict[str, str], policy: ContainerPolicy | None, environ: Mapping[str, str]) -> Placed:
    """The run's environment and container policy as Slurm's allocation (``environ``, the batch
    job's environment) places them."""
    moved = follow_scheduler_gpus(env, policy, environ.get("SLURM_JOB_GPUS", ""))
    gpus = None
    if moved is not None:
        env, policy, gpus = moved
    node = environ.get("SLURMD_NODENAME", "")
    if node and policy:
        policy = follow_scheduler_node(policy, node)
    # MASTER_ADDR from the allocation, wherever Slurm placed it (a job network, where the ranks
    # have one, gives its own later).
    env = {**env, "MASTER_ADDR": environ.get("SLURM_LAUNCH_NODE_IPADDR") or "127.0.0.1"}
    slurm = {k: v for k, v in environ.items() if k.startswith(("SLURM_", "SLURMD_")) and k not in env and k != "SLURM_CONF"}
    env = {**env, **slurm}
    job_id = environ.get("SLURM_JOB_ID", "")
    if policy and job_id.isdigit():
        policy = {**policy, "labels": {**(policy.get("labels") or {}), SLURM_JOB_LABEL: int(job_id)}}
    return Placed(env=env, policy=policy, gpus=gpus, node=node or None)
