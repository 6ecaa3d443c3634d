"""``datastates.llm`` finds ckptlib even where ckptlib is not installed, from the vendor dir alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import ckptlib

SCRIPT = """
import os
import sys
# Hide any install of ckptlib (the editable one, or a path entry holding it such as the torch-pin
# venv's .pth), as in a job image where only $CHECKPOINT_VENDOR is on the path.
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path_hooks = [h for h in sys.path_hooks if "editable" not in repr(h).lower()]
sys.path = [p for p in sys.path if not os.path.isdir(os.path.join(p or ".", "ckptlib"))]
sys.path_importer_cache.clear()
try:
    import ckptlib
    raise SystemExit("ckptlib should not be importable before the shim")
except ImportError:
    pass
from datastates.llm import DecoratedCheckpointing
print(DecoratedCheckpointing.__module__)
"""


@pytest.mark.slow  # a training process of its own
def test_the_vendor_dir_alone_is_enough(tmp_path: Path) -> None:
    env = {"PYTHONPATH": ckptlib.vendor_path(), "PATH": "/usr/bin:/bin"}
    completed = subprocess.run([sys.executable, "-c", SCRIPT], check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.strip() == "ckptlib._trainer"
