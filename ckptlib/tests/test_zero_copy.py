"""Page-aligned CPU tensors are written straight from memory, and never after they change.

With ``THP_MEM_ALLOC_ENABLE=1`` (set before torch allocates, so in a child process) torch puts
large CPU tensors on page boundaries and ckptlib writes them without a copy until the next
optimizer step; whatever is not written by then is copied first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, time
import torch
import ckptlib
from ckptlib.tests.helpers import assert_same

torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(3)])  # 4 MiB weights
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
state = {"model": model, "optimizer": optimizer}


def train(steps):
    for _ in range(steps):
        model(torch.randn(4, 1024)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def snapshot():
    return {
        "model": {k: v.clone() for k, v in model.state_dict().items()},
        "optimizer": {k: {n: t.clone() for n, t in s.items()} for k, s in optimizer.state_dict()["state"].items()},
    }


engine = ckptlib.CheckpointEngine(output_dir=sys.argv[1], host_cache_size=0.05, handle_signals=False)
big = sum(p.numel() * 4 * 3 for p in model.parameters() if p.dim() == 2)
report = {}
train(2)

# 1. The next step comes at once: live ranges not yet written are copied before it changes them.
expected = snapshot()
engine.save(state, step=2)
train(1)
[result] = engine.wait(persist=True)
loaded = engine.load(2)
assert_same(expected["model"], loaded.state["model"], "model")
assert_same(expected["optimizer"], loaded.state["optimizer"]["state"], "optimizer")
report["first"] = {"committed": result.committed, **engine.staging_stats()}

# 2. The writers have time: the big tensors go to disk without a copy.
before = engine.staging_stats()
expected = snapshot()
engine.save(state, step=3)
deadline = time.monotonic() + 30
while not engine._stager.idle and time.monotonic() < deadline:
    engine._stage_at_hook(force=False)
    time.sleep(0.01)
train(1)
[result] = engine.wait(persist=True)
loaded = engine.load(3)
assert_same(expected["model"], loaded.state["model"], "model")
assert_same(expected["optimizer"], loaded.state["optimizer"]["state"], "optimizer")
after = engine.staging_stats()
report["second"] = {
    "committed": result.committed,
    "live": after["live_bytes"] - before["live_bytes"],
    "copied": after["copied_bytes"] - before["copied_bytes"],
    "big": big,
}
engine.shutdown()
print(json.dumps(report))
"""


def _run(tmp_path: Path, env_extra: dict[str, str]) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **env_extra}
    completed = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, env=env, timeout=300
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_aligned_tensors_are_written_from_memory_and_the_next_step_never_leaks_in(tmp_path: Path) -> None:
    report = _run(tmp_path, {"THP_MEM_ALLOC_ENABLE": "1"})

    assert report["first"]["committed"] and report["second"]["committed"]
    second = report["second"]
    # Weights and both Adam moments of the three layers: written without a copy.
    assert second["live"] >= second["big"], second
    assert second["copied"] < second["big"] / 10, second


def test_without_aligned_allocations_every_byte_is_copied_and_still_exact(tmp_path: Path) -> None:
    env = {"THP_MEM_ALLOC_ENABLE": "0"}
    report = _run(tmp_path, env)

    assert report["second"]["committed"]
    assert report["second"]["live"] == 0
    assert report["second"]["copied"] >= report["second"]["big"]
