"""Child of the DeepSpeed in-place test: ZeRO stage argv[2], ``use_ckptlib``, 12 tags; after each
``save_checkpoint`` a parameter is changed in place (before the next ``step()``). Prints one JSON
line: which tags got ``latest`` at their commit, and which of them load as they were at their
save; ``latest`` after ``destroy()`` (the last save, committed there)."""

from __future__ import annotations

import json
import os
import sys

import torch

from ckptlib.deepspeed import use_ckptlib
from ckptlib.tests._deepspeed_child import build, step

TAGS = 12


def main() -> None:
    out, stage = sys.argv[1], int(sys.argv[2])
    config = {"train_batch_size": 4, "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True}
    engine = build(0, config)
    use_ckptlib(engine)
    expected = {}
    committed = []
    latest_path = os.path.join(out, "latest")
    for index in range(TAGS):
        step(engine)
        tag = f"t{index}"
        expected[tag] = {k: v.clone() for k, v in engine.module.state_dict().items()}
        engine.save_checkpoint(out, tag=tag)
        with torch.no_grad():
            engine.module[0].weight.add_(1e-3)  # in place, after save_checkpoint returned
        if index == TAGS - 1:
            break
        before = open(latest_path).read() if os.path.exists(latest_path) else None
        step(engine)  # commits the tag (or leaves latest alone)
        after = open(latest_path).read() if os.path.exists(latest_path) else None
        if after == tag and before != tag:
            committed.append(tag)
    engine.destroy()
    last_latest = open(latest_path).read() if os.path.exists(latest_path) else None
    if last_latest == f"t{TAGS - 1}":
        committed.append(last_latest)
    wrong = []
    for tag in committed:
        fresh = build(1, config)
        use_ckptlib(fresh)
        fresh.load_checkpoint(out, tag=tag)
        if not all(torch.equal(expected[tag][k], v) for k, v in fresh.module.state_dict().items()):
            wrong.append(tag)
        fresh.destroy()
    print(json.dumps({"committed": committed, "wrong": wrong, "latest": last_latest}))


if __name__ == "__main__":
    main()
