"""Fixtures for ckptlib's tests: no Django, no downloads; tiny models built from configs."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import ckptlib

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"


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
