"""CPU tensors are written straight from memory where direct I/O allows, and never after they change.

With ``THP_MEM_ALLOC_ENABLE=1`` (set before torch allocates, so in a child process) torch puts
large CPU tensors on page boundaries and ckptlib writes them without a copy until the next
optimizer step; whatever is not written by then is copied first. Without it, or for a model
whose tensors sit at odd offsets (``from_pretrained``'s), a ``.safetensors`` file starts its data
at the offset most of its tensors have in memory, so they are written from memory too.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptlib
from ckptlib._writer import _PROBE_OFFSETS, _probe_alignment
from ckptlib.tests.helpers import assert_same

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
weights = sum(p.numel() * 4 for p in model.parameters() if p.dim() == 2)
big = 3 * weights  # the weights and both Adam moments
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
    "weights": weights,
}
engine.shutdown()
print(json.dumps(report))
"""


def _run(tmp_path: Path, env_extra: dict[str, str]) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **env_extra}
    completed = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], check=False, capture_output=True, text=True, env=env, timeout=300)
    assert completed.returncode == 0, completed.stderr[-4000:]
    report: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return report


@pytest.mark.slow  # a training process of its own
def test_aligned_tensors_are_written_from_memory_and_the_next_step_never_leaks_in(tmp_path: Path) -> None:
    report = _run(tmp_path, {"THP_MEM_ALLOC_ENABLE": "1"})

    assert report["first"]["committed"] and report["second"]["committed"]
    second = report["second"]
    # Weights and both Adam moments of the three layers: written without a copy.
    assert second["live"] >= second["big"], second
    assert second["copied"] < second["big"] / 10, second


@pytest.mark.slow  # a training process of its own
def test_without_aligned_allocations_the_model_file_is_laid_out_for_its_tensors(tmp_path: Path) -> None:
    env = {"THP_MEM_ALLOC_ENABLE": "0"}
    report = _run(tmp_path, env)

    second = report["second"]
    assert second["committed"]
    # The 4 MiB weights sit 64 bytes past a page boundary (glibc's mmap'd chunks): the model's
    # file puts them at that offset too and writes them from memory, all but each one's first
    # page. The Adam moments (optimizer.pt, records at page boundaries) are copied; still exact.
    assert second["weights"] - 3 * 4096 <= second["live"] < second["big"] / 2, second
    assert second["copied"] >= second["big"] - second["weights"], second


@pytest.mark.slow  # the engine's staging and writer threads, waited on
def test_tensors_at_odd_offsets_are_written_from_memory_into_a_valid_safetensors_file(tmp_path: Path) -> None:
    from safetensors.torch import load_file  # optional (ckptlib reads its files without it): only this test needs it

    # As from_pretrained leaves a model (transformers 5.24): each weight 8 bytes past a page.
    layers = [torch.nn.Linear(1024, 1024, bias=False) for _ in range(3)]
    model = torch.nn.Sequential(*layers)
    backing = []
    for layer in layers:
        buffer = torch.empty(4 << 20 | 8192, dtype=torch.uint8)
        start = -buffer.data_ptr() % 4096 + 8
        weight = buffer[start : start + (4 << 20)].view(torch.float32).view(1024, 1024)
        weight.copy_(layer.weight.detach())
        layer.weight = torch.nn.Parameter(weight)
        backing.append(buffer)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(2, 1024)).sum().backward()
    optimizer.step()
    assert all(p.data_ptr() % 4096 == 8 for p in model.parameters())
    expected = {name: tensor.clone() for name, tensor in model.state_dict().items()}

    engine = ckptlib.CheckpointEngine(output_dir=tmp_path, host_cache_size=0.05, handle_signals=False)
    try:
        engine.save({"model": model, "optimizer": optimizer}, step=1)
        deadline = time.monotonic() + 30  # as training would: ordinary staging points until written
        while not engine._stager.idle and time.monotonic() < deadline:
            engine._stage_at_hook(force=False)
            time.sleep(0.01)
        engine.wait(persist=True)
        stats = engine.staging_stats()
    finally:
        engine.shutdown()

    # All but each weight's first page went from its own memory (the writers had it all before
    # any optimizer step); the safetensors library reads the file as any other.
    assert stats["live_bytes"] >= 3 * ((4 << 20) - 4096), stats
    path = tmp_path / "concurrent_checkpoint" / "checkpoint-1" / "model.safetensors"
    assert_same(expected, load_file(path), "model.safetensors")
    header = int.from_bytes(path.read_bytes()[:8], "little")
    assert (8 + header) % 8 == 0  # data still 8-byte aligned in the file


def test_the_probed_memory_alignment_is_what_direct_writes_accept_and_leaves_nothing_behind(tmp_path: Path) -> None:
    alignment = _probe_alignment(tmp_path)

    assert alignment in (1, 4, 16, 64, 512, 4096)
    assert list(tmp_path.iterdir()) == []
    if alignment in (1, 4096):
        return  # no direct I/O here, or only from page-aligned memory: nothing more to show
    memory = mmap.mmap(-1, 3 * 4096)
    view = memoryview(memory)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    try:
        assert os.pwrite(fd, view[alignment : alignment + 4096], 4096) == 4096
        if alignment > _PROBE_OFFSETS[0]:  # the offset tried before it is refused
            smaller = _PROBE_OFFSETS[_PROBE_OFFSETS.index(alignment) - 1]
            try:
                os.pwrite(fd, view[smaller : smaller + 4096], 0)
            except OSError as error:
                assert error.errno == errno.EINVAL
            else:
                raise AssertionError(f"a write from {smaller} bytes past a page was accepted")
    finally:
        os.close(fd)
        view.release()
        memory.close()
