"""Which process this is among the launched ones (torchrun, accelerate launch, deepspeed)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch.distributed as dist


@dataclass(frozen=True)
class ProcessPlace:
    """Global rank and world size of this process.

    Attributes:
        rank: Global rank; rank 0 commits.
        world_size: Processes writing one checkpoint together.
        local_rank: Rank on this machine (the launcher's ``--local_rank``), -1 when not launched.
    """

    rank: int
    world_size: int
    local_rank: int


def current_place(*, local_rank: int | None = None) -> ProcessPlace:
    """Reads the launcher's environment, falling back to an initialized process group.

    Args:
        local_rank: The ``rank`` given to ``DecoratedCheckpointing`` (the script's ``--local_rank``).
    """
    env_rank, env_world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if env_rank is not None and env_world is not None:
        rank, world = int(env_rank), int(env_world)
    else:
        rank, world = _from_process_group()
    if local_rank is None or local_rank < 0:
        local_rank = int(os.environ.get("LOCAL_RANK", "-1"))
    return ProcessPlace(rank=rank, world_size=max(world, 1), local_rank=local_rank)


def _from_process_group() -> tuple[int, int]:
    # A torch built without distributed still has the module: is_available() says so.
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
