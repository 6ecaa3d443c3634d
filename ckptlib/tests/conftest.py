"""Fixtures for ckptlib's tests: no Django, no downloads; tiny models built from configs."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import ckptlib
from ckptlib.tests.helpers import RecordingHandler

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"

# One torch thread in the test process: the suite's lanes share the machine's cores (xdist workers,
# the other stream's lanes), and torch's own pool (an OpenMP thread per core, spinning while it
# waits) then fights them. On a 2-core machine beside a busy core: the fast lane's ckptlib tests
# 78 s → 32 s on two workers; test_inplace_after_save's slow ones 81 s → 27 s (73 → 21 CPU-s).
# The processes the tests start get OMP_NUM_THREADS=1 (``job_env``) for the same reason.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def offline_assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The Spot example's local model, tokenizer and text, built once per session."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        import offline_assets as assets  # from the examples directory, put on the path just for it
    finally:
        sys.path.remove(str(EXAMPLES))
    directory = tmp_path_factory.mktemp("offline-assets")
    paths: dict[str, str] = assets.prepare(directory)
    paths["root"] = str(directory)
    return paths


@pytest.fixture
def job_env(tmp_path: Path) -> dict[str, str]:
    """The environment a platform job gets: the vendor dir on PYTHONPATH, offline hub."""
    env = {k: v for k, v in os.environ.items() if k not in {"CKPT_LAST_STEP", "RANK", "WORLD_SIZE", "LOCAL_RANK"}}
    env.update(
        CHECKPOINT_VENDOR=ckptlib.vendor_path(),
        PYTHONPATH=ckptlib.vendor_path(),
        HF_DATASETS_OFFLINE="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf-home"),
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",
        THP_MEM_ALLOC_ENABLE="1",
    )
    return env


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[ckptlib.CheckpointEngine]:
    """A checkpoint engine writing to the test's ``tmp_path``, with a small host cache and no
    signal handlers of its own; shut down after the test."""
    engine = ckptlib.CheckpointEngine(output_dir=tmp_path, host_cache_size=0.1, handle_signals=False)
    yield engine
    engine.shutdown()


@pytest.fixture
def records() -> Iterator[RecordingHandler]:
    """What ckptlib logs during the test."""
    handler = RecordingHandler()
    logging.getLogger("ckptlib").addHandler(handler)
    yield handler
    logging.getLogger("ckptlib").removeHandler(handler)
