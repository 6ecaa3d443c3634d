"""Upstream DataStates' module paths import from the vendor directory, re-exporting what ckptlib
has; a name ckptlib does not implement (the C++ ``CkptEngine``) raises an ``ImportError`` naming it."""

from __future__ import annotations

import subprocess
import sys

import pytest

import ckptlib

MODULES = [
    "datastates.llm.checkpointing",
    "datastates.llm.helper",
    "datastates.llm.deepspeed.helper",
    "datastates.utils.datastates_logger",
    "datastates.ckpt.ckpt_engine",
    "datastates.state_ckpt",
    "datastates.helper",
    "datastates.engines",
    "datastates.deepspeed",
    "datastates.deepspeed.helper",
]

SCRIPT = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
from datastates.llm.checkpointing import Checkpointing
from datastates.ckpt.ckpt_engine import CheckpointEngine
from datastates.engines import CheckpointEngine as Engine2, parse_config
from datastates.llm.helper import HOST_CACHE_SIZE, get_checkpoint_version
from datastates.utils.datastates_logger import get_logger
assert Checkpointing is CheckpointEngine is Engine2
assert parse_config({"host_cache_size": 2}) == {"host_cache_size": 2, "parser_threads": 4}
assert get_checkpoint_version("out/global_step7/mp_rank_00_model_states.pt") == 7
for module, name in [("datastates.ckpt.ckpt_engine", "CkptEngine"), ("datastates.engines", "StateCheckpointEngine")]:
    try:
        exec(f"from {module} import {name}")
    except ImportError as error:
        assert name in str(error) and "not implemented" in str(error), error
    else:
        raise AssertionError(name)
print("ok")
"""


@pytest.mark.slow  # a Python process of its own
def test_upstream_module_paths_import_from_the_vendor_directory() -> None:
    env = {"PYTHONPATH": ckptlib.vendor_path(), "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", SCRIPT, *MODULES], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
