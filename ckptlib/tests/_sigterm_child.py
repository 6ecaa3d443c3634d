"""Child process of the SIGTERM exactness test: a plain PyTorch loop (Adam on CPU) that keeps a
deep copy of its state at every step and writes them out when it exits.

    python _sigterm_child.py OUTPUT_DIR REFS_FILE LANDED_FILE {hooks,safe_point} SAVE_EVERY [SELF_SIGNAL_AT]

With SELF_SIGNAL_AT=k, the child sends itself SIGTERM inside the optimizer step of step k (or a
later one on a busy machine: ``helpers.arm_self_signal``); otherwise the parent sends it.

Adam runs its per-parameter loop (``foreach=False``) over a few hundred small parameters, so most
of the loop's time is inside ``optimizer.step()``: that is where most signals land.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path
from typing import Any

import torch

import ckptlib
from ckptlib.tests.helpers import arm_self_signal, clone_state


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        self.extra = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(8, 8)) for _ in range(600)])

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        loss: torch.Tensor = self.body(inputs).pow(2).mean() + torch.stack([p.sum() for p in self.extra]).sum() * 1e-3
        return loss


def main() -> None:
    output_dir, refs_file, landed_file, mode, save_every = sys.argv[1:6]
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, foreach=False)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.9)
    state: dict[str, Any] = {"model": model, "optimizer": optimizer, "scheduler": scheduler}
    step = 0
    engine = ckptlib.CheckpointEngine(output_dir=output_dir, host_cache_size=0.05, final_state=lambda: (state, step), grace_period_s=20)
    self_signal_at = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    arm_self_signal(optimizer, lambda: step, at=self_signal_at, landed_file=Path(landed_file), rng=random.Random(os.getpid()))
    refs: dict[int, dict[str, Any]] = {}
    try:
        while step < 5000:
            loss = model(torch.randn(8, 16))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
            step += 1
            refs[step] = {key: clone_state(value.state_dict()) for key, value in state.items()}
            if step % int(save_every) == 0:
                engine.save(state, step=step)
            if step == 3:
                print("ready", flush=True)
            if mode == "safe_point":
                ckptlib.safe_point()
    finally:
        torch.save({"last_step": step, "refs": refs}, refs_file)


if __name__ == "__main__":
    main()
