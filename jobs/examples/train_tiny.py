"""A small PyTorch training run for trying the console: a tiny MLP fitting a noisy sine.

    PYTHONPATH=$CHECKPOINT_VENDOR python -m jobs.examples.train_tiny --epochs 3 --output-dir $OUTPUT_DIR --datastates --checkpoint

With ``--datastates`` it first imports the DataStates drop-in (``datastates.llm``, importable when
``PYTHONPATH=$CHECKPOINT_VENDOR``) and fails at once if it cannot, so a lost ``PYTHONPATH`` is seen.
With ``--checkpoint`` it commits a checkpoint with ckptlib at the end of each epoch (the job's
Checkpoints tab lists them) and, re-placed after a fault, resumes from the newest one.

Prints what a real job prints (dataset initialisation, one line per step group with loss and
learning rate, the final loss) and saves the model to ``<output-dir>/model.pt``.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import torch
from torch import nn


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps-per-epoch", type=int, default=50)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default=os.environ.get("OUTPUT_DIR", "."))
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds to sleep per step (to watch it run)")
    parser.add_argument("--fail-at-epoch", type=int, default=None, help="raise an error at this epoch")
    parser.add_argument("--datastates", action="store_true", help="import datastates.llm first (fail if it is missing)")
    parser.add_argument("--checkpoint", action="store_true", help="commit a ckptlib checkpoint each epoch; resume from the newest")
    args = parser.parse_args()

    if args.datastates:
        try:
            from datastates.llm import DecoratedCheckpointing  # only with --datastates: on CHECKPOINT_VENDOR's path then
        except ImportError as exc:
            print(f"cannot import datastates.llm ({exc}); is PYTHONPATH=$CHECKPOINT_VENDOR set?", flush=True)
            return 2
        print(f"DataStates checkpointing available: datastates.llm.{DecoratedCheckpointing.__name__}", flush=True)

    torch.manual_seed(args.seed)
    print("Starting dataset initialization", flush=True)
    x = torch.linspace(-math.pi, math.pi, 512).unsqueeze(1)
    y = torch.sin(x) + 0.05 * torch.randn_like(x)
    model = nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    total = args.epochs * args.steps_per_epoch
    print(f"Training for {args.epochs} epochs, {total} steps, on {os.environ.get('CUDA_VISIBLE_DEVICES') or 'cpu'}", flush=True)
    step = 0
    loss = torch.tensor(float("nan"))
    engine = None
    if args.checkpoint:
        from ckptlib import CheckpointEngine  # on the path with PYTHONPATH=$CHECKPOINT_VENDOR (and in the default image)

        engine = CheckpointEngine(output_dir=args.output_dir, host_cache_size=1, parser_threads=1)
        if engine.latest_step() is not None:
            step = engine.load(into={"model": model, "optimizer": optimizer}).step
            print(f"resuming from checkpoint step {step}", flush=True)
    for epoch in range(step // args.steps_per_epoch + 1, args.epochs + 1):
        if args.fail_at_epoch == epoch:
            raise RuntimeError(f"deliberate failure at epoch {epoch}")
        for _ in range(args.steps_per_epoch):
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            if args.sleep:
                time.sleep(args.sleep)
        print(f"epoch {epoch}/{args.epochs} step {step}/{total} loss {loss.item():.5f} lr {args.lr}", flush=True)
        if engine is not None:
            engine.save({"model": model, "optimizer": optimizer}, step=step)
    if engine is not None:
        engine.shutdown()  # waits for the checkpoints in flight
    os.makedirs(args.output_dir, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(args.output_dir, "model.pt"))
    print(f"Training complete: final loss {loss.item():.5f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
