"""A plain PyTorch training loop using ckptlib's API directly (no Trainer).

    python examples/plain_pytorch.py --output-dir /tmp/plain --steps 50 --save-every 10

Run it twice: the second run resumes from the latest committed checkpoint. Under
``torchrun --nproc_per_node 2`` every rank saves its RNG state and rank 0 the model and optimizer.
"""

from __future__ import annotations

import argparse

import torch

import ckptlib


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", default="./plain-results")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--save-every", type=int, default=10)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler}
    step = 0

    # On SIGTERM (Spot reclaim) and at exit the engine saves this and waits for it to persist.
    engine = ckptlib.CheckpointEngine(output_dir=args.output_dir, host_cache_size=1, parser_threads=1, final_state=lambda: (state, step))
    if engine.latest_step() is not None:
        step = engine.load(into=state).step
        print(f"resumed from step {step}", flush=True)

    while step < args.steps:
        inputs = torch.randn(64, 32)
        loss = (model(inputs) - inputs.sum(dim=1, keepdim=True)).pow(2).mean()
        loss.backward()
        optimizer.step()  # waits only if the last checkpoint is still being staged
        optimizer.zero_grad()
        scheduler.step()
        step += 1
        if step % args.save_every == 0:
            engine.save(state, step=step)  # returns at once; written in the background
            print(f"step {step} loss {loss.item():.4f}", flush=True)

    engine.shutdown()  # waits for the checkpoints in flight
    print(f"done at step {step}; latest committed: {engine.latest_step()}", flush=True)


if __name__ == "__main__":
    main()
