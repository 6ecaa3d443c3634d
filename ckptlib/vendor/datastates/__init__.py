"""Vendor shim: ``datastates`` as the service's documentation imports it, backed by ckptlib.

``datastates.CheckpointEngine`` is what DeepSpeed's ``"datastates_ckpt": {"enabled": true}``
setting instantiates (``ckptlib.deepspeed.DataStatesEngine``).
"""

from __future__ import annotations

try:
    import ckptlib  # noqa: F401  # installed in the job's environment
except ImportError:
    import sys
    from pathlib import Path

    # <repo>/ckptlib/vendor/datastates/__init__.py → <repo> holds the ckptlib package.
    sys.path.append(str(Path(__file__).resolve().parents[3]))
    import ckptlib  # noqa: F401


def __getattr__(name: str):  # noqa: ANN202 - lazy: torch is imported only when used
    if name == "CheckpointEngine":
        from ckptlib.deepspeed import DataStatesEngine

        return DataStatesEngine
    raise AttributeError(name)
