"""Child process of the SIGKILL test: saves forever; every tensor of checkpoint N holds the value N."""

from __future__ import annotations

import sys

import torch

import ckptlib


def main() -> None:
    engine = ckptlib.CheckpointEngine(output_dir=sys.argv[1], host_cache_size=0.2, handle_signals=False)
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)])
    step = 0
    while True:
        step += 1
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.fill_(step)
        engine.save({"model": model, "counter": {"step": step}}, step=step, capture_rng=False)


if __name__ == "__main__":
    main()
