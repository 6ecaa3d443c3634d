"""Saving a path again while its first write is in flight (DeepSpeed re-saving a fixed tag):
each save writes its own temporary file, the newest save's content ends at the path, no error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ckptlib._dropin import PathCheckpointing

TRIALS = 20


@pytest.mark.parametrize("threads", [1, 4])
def test_resave_of_a_path_in_flight_keeps_the_newest_and_raises_nothing(tmp_path: Path, threads: int) -> None:
    engine = PathCheckpointing({"host_cache_size": 0.05, "parser_threads": threads}, rank=0)
    errors = 0
    try:
        for trial in range(TRIALS):
            path = tmp_path / f"trial{trial}" / "mp_rank_00_model_states.pt"
            newest = torch.full((1 << 18,), 2.0)
            first: dict[str, object] = {"module": torch.full((1 << 18,), 1.0), "trial": trial}
            second: dict[str, object] = {"module": newest, "trial": trial}
            engine.save(first, path)
            engine.save(second, path)
            try:
                engine.wait(persist=True)
            except Exception:  # counted: the test asserts there is none
                errors += 1
                continue
            loaded = torch.load(path, weights_only=False)
            assert loaded["trial"] == trial and torch.equal(loaded["module"], newest), trial
            assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left
    finally:
        engine.shutdown()
    assert errors == 0
