"""Exactness of ckptlib's CUDA staging, for a machine with a GPU (not run by the test suite).

    python -m ckptlib.tests.gpu_check [--steps 40] [--out DIR]

Trains a model on ``cuda:0`` with a checkpoint every step and compares every committed checkpoint,
bit for bit, with a copy of the state taken at its step (cloned on the GPU, then moved to the
host). Each step is made hard for the staging rules (``ckptlib._device.DeviceCopies``):

* the optimizer step runs on a non-default stream, and a long matmul chain is queued just before
  ``save()``, so the step's kernels may still be running when ``save()`` returns (rule 1: the
  copy stream must wait for them);
* BatchNorm statistics are cloned at ``save()`` and dropped once handed over, while the GPU
  keeps allocating (rule 2: ``record_stream``);
* the next optimizer step follows at once (rule 3: the pre-step hook synchronizes the copies);
* an EMA and a tensor learning rate change in place right after ``save()``.

Prints the number of checkpoints compared and the mismatches; exits 1 on any mismatch, 2 when
there is no CUDA device.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from typing import Any

import torch

import ckptlib
from ckptlib.tests.helpers import assert_same, clone_state


def _to_host(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: _to_host(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_host(item) for item in value)
    return copy.deepcopy(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device; nothing checked")
        return 2
    device = torch.device("cuda:0")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.BatchNorm1d(4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).to(device)
    ema = copy.deepcopy(model).requires_grad_(False)
    optimizer = torch.optim.Adam(model.parameters(), lr=torch.tensor(1e-3, device=device))
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.99)
    state: dict[str, Any] = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "ema": ema}
    out = args.out or tempfile.mkdtemp(prefix="ckptlib-gpu-check-")
    engine = ckptlib.CheckpointEngine(output_dir=out, host_cache_size=0.5, handle_signals=False)
    side = torch.cuda.Stream()
    busy = torch.randn(4096, 4096, device=device)
    expected: dict[int, dict[str, Any]] = {}
    try:
        with torch.cuda.stream(side):
            for step in range(1, args.steps + 1):
                model(torch.randn(256, 1024, device=device)).pow(2).mean().backward()
                for _ in range(8):  # keep the stream busy past save()
                    busy = torch.tanh(busy @ busy * 1e-3)
                optimizer.step()
                optimizer.zero_grad()
                # A copy on the same stream, ordered after the step: what the checkpoint must hold.
                reference = {key: clone_state(value.state_dict()) for key, value in state.items()}
                engine.save(state, step=step, capture_rng=False)
                with torch.no_grad():
                    for averaged, live in zip(ema.parameters(), model.parameters(), strict=True):
                        averaged.mul_(0.9).add_(live, alpha=0.1)
                scheduler.step()
                torch.empty(64 << 20, dtype=torch.uint8, device=device).fill_(step)  # reuse freed blocks
                expected[step] = reference
        torch.cuda.synchronize()
        engine.wait(persist=True)
        mismatches = []
        for step in engine.committed_steps():
            loaded = engine.load(step).state
            for key, value in expected[step].items():
                try:
                    assert_same(_to_host(value), loaded[key], f"step {step} {key}")
                except AssertionError as error:
                    mismatches.append(str(error))
        count = len(engine.committed_steps())
        print(f"gpu_check: {count} checkpoints compared bit for bit on {torch.cuda.get_device_name(0)}, "
              f"{len(mismatches)} mismatches; staging {engine.staging_stats()}")  # fmt: skip
        for line in mismatches[:20]:
            print("  mismatch:", line)
        return 1 if mismatches or count != args.steps else 0
    finally:
        engine.shutdown()


if __name__ == "__main__":
    sys.exit(main())
