"""Child process of the DeepSpeed test: one CPU rank, ZeRO stage argv[2], checkpoints through ckptlib.

argv[3] is ``adapter`` (``ckptlib.deepspeed.use_ckptlib``) or ``datastates`` (DeepSpeed's own
``datastates_ckpt`` setting, with the vendor directory on ``sys.path``). Prints one JSON line.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.update(
    RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("DS_TEST_PORT", "29533"),
    DS_ACCELERATOR="cpu",
)  # fmt: skip

import deepspeed
import torch

from ckptlib.deepspeed import use_ckptlib

# One process on gloo needs no shared-memory collective (its JIT build needs a compiler).
comm_torch: Any = importlib.import_module("deepspeed.comm.torch")  # DeepSpeed ships no types
comm_torch.build_shm_op = lambda: None
deepspeed.init_distributed(dist_backend="gloo")


def build(seed: int, config: dict[str, Any]) -> Any:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine


def step(engine: Any) -> None:
    loss = engine(torch.randn(4, 512)).pow(2).mean()
    engine.backward(loss)
    engine.step()


def main() -> None:
    out, stage, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    config: dict[str, Any] = {"train_batch_size": 4, "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True}
    if mode == "datastates":
        config["datastates_ckpt"] = {"enabled": True, "host_cache_size": 1}
    engine = build(0, config)
    if mode == "adapter":
        use_ckptlib(engine)
    step(engine)
    step(engine)
    expected = {k: v.clone() for k, v in engine.module.state_dict().items()}
    engine.save_checkpoint(out, tag="step2")
    latest = os.path.join(out, "latest")
    latest_before = Path(latest).read_text() if os.path.exists(latest) else None
    step(engine)  # a decoupled engine commits step2 here, before the optimizer step
    latest_after = Path(latest).read_text() if os.path.exists(latest) else None
    kind = type(engine.checkpoint_engine).__module__ + "." + type(engine.checkpoint_engine).__name__
    engine.destroy()

    fresh = build(1, config)
    if mode == "adapter":
        use_ckptlib(fresh)
    fresh.load_checkpoint(out, tag="step2")
    same = all(torch.equal(expected[k], v) for k, v in fresh.module.state_dict().items())
    files = sorted(os.listdir(os.path.join(out, "step2")))
    fresh.destroy()
    print(json.dumps({"latest_before": latest_before, "latest_after": latest_after, "same": same, "files": files, "engine": kind}))


if __name__ == "__main__":
    main()
