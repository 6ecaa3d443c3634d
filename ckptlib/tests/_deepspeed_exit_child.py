"""Child of the DeepSpeed exit test: ``use_ckptlib``, two tags saved, then the script simply ends
(no ``destroy()``): the exit hook commits the last save, so ``latest`` names it."""

from __future__ import annotations

import sys

from ckptlib.deepspeed import use_ckptlib
from ckptlib.tests._deepspeed_child import build, step


def main() -> None:
    out = sys.argv[1]
    engine = build(0, {"train_batch_size": 4, "zero_optimization": {"stage": 0}})
    use_ckptlib(engine)
    for tag in ("t0", "t1"):
        step(engine)
        engine.save_checkpoint(out, tag=tag)
    # No destroy(), no commit_pending(): the interpreter's exit must commit "t1".


if __name__ == "__main__":
    main()
