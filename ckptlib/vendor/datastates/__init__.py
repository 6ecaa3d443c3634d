"""Vendor shim: ``datastates`` as upstream DataStates and the service's documentation import it,
backed by ckptlib.

``datastates.CheckpointEngine(runtime_config, rank)`` is upstream's path-addressed engine (what
DeepSpeed's ``"datastates_ckpt": {"enabled": true}`` setting instantiates): ``save(state_dict,
path)``, ``load(path, map_location)``, ``wait(persist)``, ``commit(tag)``, ``shutdown()``; see
``ckptlib._dropin`` for what is and is not the same as upstream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

try:
    import ckptlib  # installed in the job's environment
except ImportError:
    import sys
    from pathlib import Path

    # <repo>/ckptlib/vendor/datastates/__init__.py → <repo> holds the ckptlib package.
    sys.path.append(str(Path(__file__).resolve().parents[3]))
    import ckptlib  # noqa: F401

if TYPE_CHECKING:
    from ckptlib._dropin import PathCheckpointing


def __getattr__(name: str) -> type[PathCheckpointing]:
    if name in ("CheckpointEngine", "BaseCheckpointEngine"):
        # Lazy: ``import datastates`` stays light; torch is imported only when the engine is used.
        from ckptlib._dropin import PathCheckpointing

        return PathCheckpointing
    raise AttributeError(name)
