"""Child of the DeepSpeed in-place test: for each ``STAGE:SCENARIO`` case of argv[2:] (ZeRO stage,
scenario), one engine with ``use_ckptlib`` saves ``TAGS`` tags, and after each ``save_checkpoint``
the state is changed in place (before the next ``step()``): a parameter (``no_grad`` ``add_``), the
optimizer's state, the EMA swap through ``load_state_dict`` and back, or all of them. The cases run
one after the other in this one process (DeepSpeed's import and its process group once), each in
its own directory ``argv[1]/<stage>-<scenario>``. Prints one JSON line per case: the case, which
tags got ``latest`` at their commit, and which of them load (module and optimizer) other than they
were at their save; ``latest`` after ``destroy()`` (the last save, committed there)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from ckptlib.deepspeed import use_ckptlib
from ckptlib.tests._deepspeed_child import build, step

# 100 by default; the torch 2.12.1 lane runs every case with fewer (ckptlib/tests/torch_pin.mk).
TAGS = int(os.environ.get("DS_INPLACE_TAGS") or 100)


def inner_optimizer(engine: Any) -> Any:
    """The torch optimizer whose state is stepped (ZeRO's wraps it)."""
    optimizer = engine.optimizer
    return getattr(optimizer, "optimizer", optimizer)


def change_parameters(engine: Any) -> None:
    with torch.no_grad():
        engine.module[0].weight.add_(1e-3)


def change_optimizer_state(engine: Any) -> None:
    for per_parameter in inner_optimizer(engine).state.values():
        per_parameter["exp_avg"].add_(1e-4)


def ema_swap(engine: Any) -> None:
    backup = copy.deepcopy(engine.module.state_dict())
    engine.module.load_state_dict({name: tensor * 0.5 for name, tensor in backup.items()})
    engine.module.load_state_dict(backup)


def change_all(engine: Any) -> None:
    for change in (change_parameters, change_optimizer_state, ema_swap):
        change(engine)


SCENARIOS = {"parameters": change_parameters, "optimizer_state": change_optimizer_state, "ema_swap": ema_swap, "all": change_all}


def tensors(obj: Any) -> list[torch.Tensor]:
    """The tensor leaves of a nested state, in order (what the comparison reads)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for key in sorted(obj, key=str) for t in tensors(obj[key])]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in tensors(item)]
    return []


def snapshot(engine: Any) -> dict[str, list[torch.Tensor]]:
    return {
        "module": [t.clone() for t in tensors(engine.module.state_dict())],
        "optimizer": [t.clone() for t in tensors(inner_optimizer(engine).state_dict()["state"])],
    }


def same(left: dict[str, list[torch.Tensor]], right: dict[str, list[torch.Tensor]]) -> bool:
    return all(len(left[key]) == len(right[key]) and all(torch.equal(a, b) for a, b in zip(left[key], right[key], strict=True)) for key in left)


def run_case(out: str, stage: int, scenario: str) -> dict[str, Any]:
    change = SCENARIOS[scenario]
    config = {"train_batch_size": 4, "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True}
    engine = build(0, config)
    use_ckptlib(engine)
    expected = {}
    committed = []
    latest_path = os.path.join(out, "latest")
    for index in range(TAGS):
        step(engine)
        tag = f"t{index}"
        expected[tag] = snapshot(engine)
        engine.save_checkpoint(out, tag=tag)
        change(engine)  # in place, after save_checkpoint returned
        if index == TAGS - 1:
            break
        before = Path(latest_path).read_text() if os.path.exists(latest_path) else None
        step(engine)  # commits the tag (or leaves latest alone)
        after = Path(latest_path).read_text() if os.path.exists(latest_path) else None
        if after == tag and before != tag:
            committed.append(tag)
    engine.destroy()
    last_latest = Path(latest_path).read_text() if os.path.exists(latest_path) else None
    if last_latest == f"t{TAGS - 1}":
        committed.append(last_latest)
    wrong = []
    fresh = build(1, config)
    use_ckptlib(fresh)
    for tag in committed:
        fresh.load_checkpoint(out, tag=tag)
        if not same(expected[tag], snapshot(fresh)):
            wrong.append(tag)
    fresh.destroy()
    return {"case": f"{stage}-{scenario}", "committed": committed, "wrong": wrong, "latest": last_latest}


def main() -> None:
    root = Path(sys.argv[1])
    for case in sys.argv[2:]:
        stage, scenario = case.split(":")
        out = root / f"{stage}-{scenario}"
        print(json.dumps(run_case(str(out), int(stage), scenario)), flush=True)
        shutil.rmtree(out)  # 100 tags, 300-400 MB a case: read, reported, no longer needed


if __name__ == "__main__":
    main()
