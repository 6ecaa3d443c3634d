"""Upstream names ckptlib does not implement: importing one raises an ``ImportError`` that says so."""

from __future__ import annotations

from typing import NoReturn

# Upstream's C++ engine and its Python engines over it, which have no counterpart here.
NOT_IMPLEMENTED = {
    "CkptEngine": "upstream's C++ engine (tensors at file offsets, datastates_cpp)",
    "SimpleCheckpointEngine": "upstream's engine_simple over its C++ engine",
    "StateCheckpointEngine": "upstream's engine_state over its C++ engine",
    "StateCheckpointEngineAggregated": "upstream's engine_state_aggregated over its C++ engine",
    "ENGINE_REGISTRY": "upstream's registry of its C++-backed engines",
    "StateProvider": "upstream's state provider of its C++ engine",
}


def missing(module: str, name: str) -> NoReturn:
    """Raises for ``from <module> import <name>``: ImportError when upstream has the name (it is
    not implemented by ckptlib), AttributeError otherwise (as for any module)."""
    if name in NOT_IMPLEMENTED:
        raise ImportError(
            f"{module}.{name} is not implemented by ckptlib's datastates shim: {NOT_IMPLEMENTED[name]}. "
            "Use datastates.CheckpointEngine / datastates.llm.Checkpointing (path-addressed) instead."
        )
    raise AttributeError(f"module {module!r} has no attribute {name!r}")
