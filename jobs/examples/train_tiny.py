"""A small PyTorch training run for trying the console: a tiny MLP fitting a noisy sine.

    PYTHONPATH=$CHECKPOINT_VENDOR python -m jobs.examples.train_tiny --epochs 3 --output-dir $OUTPUT_DIR --datastates

With ``--datastates`` it first imports the DataStates drop-in (``datastates.llm``, importable when
``PYTHONPATH=$CHECKPOINT_VENDOR``) and fails at once if it cannot, so a lost ``PYTHONPATH`` is seen.

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
    for epoch in range(1, args.epochs + 1):
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
    os.makedirs(args.output_dir, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(args.output_dir, "model.pt"))
    print(f"Training complete: final loss {loss.item():.5f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
