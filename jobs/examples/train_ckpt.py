"""A small PyTorch loop that checkpoints with ckptlib's plain API and resumes after a failover.

    python -m jobs.examples.train_ckpt --steps 200 --save-every 10 --output-dir $OUTPUT_DIR

On a re-placed run the platform sets ``CKPT_LAST_STEP``; the loop then loads that checkpoint and
goes on from its step, so the loss curve continues where the committed state left it. With
``CKPT_SNAPSHOT_DIR`` set it also snapshots every step into memory; a failover attempt that gets
``CKPT_RESUME_ROOT`` resumes from the replica of ``CKPT_LAST_STEP`` there (``ckptlib._snapshot``).
"""

from __future__ import annotations

import argparse
import math
import os
import time

import torch
from torch import nn

from ckptlib import CheckpointEngine


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--sleep", type=float, default=0.02)
    parser.add_argument("--output-dir", default=os.environ.get("OUTPUT_DIR", "."))
    args = parser.parse_args()

    print("Starting dataset initialization", flush=True)
    torch.manual_seed(0)
    x = torch.linspace(-math.pi, math.pi, 256).unsqueeze(1)
    y = torch.sin(x)
    model = nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    state = {"model": model, "optimizer": optimizer}
    progress = {"step": 0}
    engine = CheckpointEngine(
        output_dir=args.output_dir,
        host_cache_size=1,
        grace_period_s=10,
        final_state=lambda: (state, progress["step"]),
    )
    start = 0
    last = os.environ.get("CKPT_LAST_STEP")
    if last is not None:
        loaded = engine.load(int(last), into=state)
        start = loaded.step
        print(f"Resumed from checkpoint step {start}", flush=True)
    for step in range(start + 1, args.steps + 1):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        # In-memory snapshot for checkpointless failover: a no-op unless CKPT_SNAPSHOT_DIR is set.
        engine.snapshot(state, step=step)
        progress["step"] = step
        print(f"step {step}/{args.steps} loss {loss.item():.6f}", flush=True)
        if step % args.save_every == 0:
            engine.save(state, step=step)
        time.sleep(args.sleep)
    engine.wait(persist=True)
    engine.shutdown()
    print("Training complete", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
