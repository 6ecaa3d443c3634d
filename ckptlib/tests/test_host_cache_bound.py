"""The host cache is a bound: staging waits for the writers instead of growing past it."""

from __future__ import annotations

from pathlib import Path

import torch

import ckptlib
from ckptlib.tests.helpers import assert_same


def test_staging_waits_for_flushing_instead_of_growing(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(8)])  # 64 KiB weights
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 128)).sum().backward()
    optimizer.step()
    state = {"model": model, "optimizer": optimizer}
    limit_gb = 300e3 / 1e9  # 300 kB, against about 1.6 MB of state
    engine = ckptlib.CheckpointEngine(output_dir=tmp_path, host_cache_size=limit_gb, handle_signals=False)
    try:
        expected = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        expected = {k: {n: t.clone() for n, t in v.items()} if k == "model" else v for k, v in expected.items()}
        engine.save(state, step=1)
        [result] = engine.wait(persist=True)
        assert result.committed and result.bytes > 1_500_000
        # Bytes save() copies itself (RNG state) may sit on top of the bound, never a file's worth.
        assert engine.cache.peak_bytes <= engine.cache.limit_bytes + 70_000
        loaded = engine.load(1)
        assert_same(expected["model"], loaded.state["model"], "model")
    finally:
        engine.shutdown()
