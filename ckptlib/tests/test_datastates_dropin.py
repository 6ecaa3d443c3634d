"""Upstream DataStates' documented usage (its test scripts' ``save``/``wait``/``load`` with a dict
and with the DeepSpeed config form) runs unchanged against the vendored ``datastates`` shim."""

from __future__ import annotations

import logging
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ckptlib


@pytest.fixture(autouse=True)
def vendor_on_path() -> Iterator[None]:
    """``PYTHONPATH=$CHECKPOINT_VENDOR``, as a job gets it (the tests import ``datastates`` inside
    themselves: it is importable only once this has put the vendor directory on the path)."""
    sys.path.insert(0, ckptlib.vendor_path())
    try:
        yield
    finally:
        sys.path.remove(ckptlib.vendor_path())


class DeepSpeedConfig:
    """The DeepSpeed config form of upstream's ``tests/test_datastates_llm.py``."""

    def __init__(self) -> None:
        self.datastates_config = self.DataStatesConfig()

    class DataStatesConfig:
        def __init__(self) -> None:
            self.enabled = True
            self.config = {"host_cache_size": 1, "parser_threads": 2, "pin_host_cache": True}


def _upstream_object() -> dict[str, Any]:
    tensor = torch.randn(256, 256)
    return {
        "tensor1": tensor,
        "tensor2": torch.randn(64, dtype=torch.float64),
        "model_name": "datastates_test_model",
        "rng_iterator": 12345,
        "dtype": torch.float32,
        "shape": tensor.shape,
        "random_np_obj": np.random.randn(512).astype(np.float32),
        "nested": {"layers": [torch.arange(10), {"bias": torch.ones(3)}]},
    }


def _assert_same(recovered: dict[str, Any], saved: dict[str, Any]) -> None:
    assert torch.equal(recovered["tensor1"], saved["tensor1"])
    assert torch.equal(recovered["tensor2"], saved["tensor2"])
    assert torch.equal(recovered["nested"]["layers"][0], saved["nested"]["layers"][0])
    assert torch.equal(recovered["nested"]["layers"][1]["bias"], saved["nested"]["layers"][1]["bias"])
    assert recovered["model_name"] == "datastates_test_model"
    assert recovered["rng_iterator"] == 12345
    assert recovered["dtype"] is torch.float32 and recovered["shape"] == saved["shape"]
    assert np.array_equal(recovered["random_np_obj"], saved["random_np_obj"])


def test_llm_checkpointing_with_a_dict_config(tmp_path: Path) -> None:
    from datastates.llm import Checkpointing

    engine = Checkpointing(runtime_config={"host_cache_size": 1, "parser_threads": 2, "pin_host_cache": True}, rank=0)
    saved = _upstream_object()
    path = tmp_path / "datastates-ckpt.pt"
    assert engine.save(state_dict=saved, path=str(path)) is True
    expected = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in saved.items()}
    saved["tensor1"].add_(1)  # training goes on: the checkpoint keeps the value at save()
    engine.wait()
    recovered = engine.load(path=str(path))
    _assert_same(recovered, {**saved, "tensor1": expected["tensor1"]})
    assert engine.commit("global_step1") is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["datastates-ckpt.pt"]  # no temporary left
    engine.shutdown()


def test_checkpoint_engine_with_the_deepspeed_config_form(tmp_path: Path) -> None:
    from datastates import CheckpointEngine

    engine = CheckpointEngine(runtime_config=DeepSpeedConfig(), rank=0)
    assert engine.engine.options.parser_threads == 2
    saved = _upstream_object()
    path = tmp_path / "global_step3" / "mp_rank_00_model_states.pt"
    engine.save(state_dict=saved, path=str(path))
    engine.wait(True)
    assert path.is_file()  # durable at its path once wait(persist=True) returns
    _assert_same(engine.load(path=str(path)), saved)
    engine.shutdown()


def test_checkpoint_engine_honours_a_dict_config_and_a_string_rank(tmp_path: Path) -> None:
    import datastates

    engine = datastates.CheckpointEngine({"host_cache_size": 1, "parser_threads": 3}, "0")
    assert engine.rank == 0
    assert engine.engine.options.parser_threads == 3
    assert engine.engine.cache.limit_bytes <= 1 << 30  # GB as upstream counts them: 2**30 bytes
    engine.save({"w": torch.ones(4)}, str(tmp_path / "w.pt"))
    assert engine.commit("tag") is True
    assert torch.equal(torch.load(tmp_path / "w.pt", weights_only=False)["w"], torch.ones(4))
    engine.shutdown()
    engine.shutdown()  # idempotent, as at exit


def test_upstream_defaults_and_keys_are_accepted_without_warnings() -> None:
    import datastates

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        engine = datastates.CheckpointEngine({"host_cache_size": 0, "fast_cache_init": True, "enabled": True}, 0)
    assert engine.engine.options.parser_threads == 4  # upstream's default
    assert engine.engine.cache.limit_bytes > 0  # host_cache_size 0: sized for you
    engine.shutdown()


def test_the_module_names_people_import() -> None:
    from datastates.ckpt import CheckpointEngine as CkptCheckpointEngine
    from datastates.llm import Checkpointing
    from datastates.llm.deepspeed import get_ds_checkpoint_version, parse_ds_config
    from datastates.utils import get_logger

    assert CkptCheckpointEngine is Checkpointing
    assert get_ds_checkpoint_version("/out/global_step7/mp_rank_00_model_states.pt") == 7
    assert get_ds_checkpoint_version("/out/x.pt", 4) == 5
    assert parse_ds_config(DeepSpeedConfig())["host_cache_size"] == 1
    assert get_logger("datastates.test").level == logging.INFO


@pytest.mark.slow  # a training process of its own
def test_the_guides_log_lines(tmp_path: Path) -> None:
    # As DecoratedCheckpointing does when it starts its engine, then resumes with nothing saved.
    script = (
        "from ckptlib._events import install_console_handler\ninstall_console_handler()\n"
        "from ckptlib._trainer import _no_checkpoint_found\n_no_checkpoint_found(-1)\n"
    )
    completed = subprocess.run([sys.executable, "-c", script], check=False, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "ERROR:datastates.llm.decorator:[Concurrent Checkpoint] No Checkpoint found with step: -1" in completed.stderr
    # ckptlib's own line is still there, in its format.
    assert "[ERROR] [_trainer.py" in completed.stderr
    # With the script's own logging set up, the line goes there, once.
    configured = "import logging\nlogging.basicConfig(format='%(name)s|%(message)s')\n" + script
    completed = subprocess.run([sys.executable, "-c", configured], check=False, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert completed.stderr.count("No Checkpoint found with step: -1") == 2, completed.stderr  # ckptlib's + the guide's
    assert "datastates.llm.decorator|[Concurrent Checkpoint] No Checkpoint found with step: -1" in completed.stderr
