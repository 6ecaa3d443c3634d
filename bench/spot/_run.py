"""One run of the seed's Spot script (``examples/spot_train.py``), unchanged, for ``bench.spot``.

    python -m bench.spot._run VARIANT OUT_JSON

VARIANT is ``none`` (no save: ``DecoratedCheckpointing`` a no-op, ``save_steps`` past the end),
``sync`` (the Trainer's own synchronous save every ``SPOT_SAVE_STEPS``, ``DecoratedCheckpointing``
a no-op) or ``ckptlib`` (the script as written). The script runs through ``runpy``; only timers
are added around it: ``Trainer.train`` (the figure compared), the interval between consecutive
step ends (by position in the save cycle), and, per save, the time in the Trainer's
``_save_checkpoint`` and, under ckptlib, in its parts (planning, the Trainer's small files,
staging at hooks), plus the CPU time of ckptlib's threads. Writes one JSON object to OUT_JSON.
With ``BENCH_SPOT_PAIRED`` (a pattern such as ``SNN``), only the save cycles the pattern marks
``S`` save (``bench.spot``'s paired cycles).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import threading
import time
from collections import defaultdict
from itertools import pairwise
from pathlib import Path
from typing import Any

TIMES: dict[str, float] = defaultdict(float)
COUNTS: dict[str, int] = defaultdict(int)


def _timed(owner: Any, name: str, label: str) -> None:
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            if threading.current_thread() is threading.main_thread():
                TIMES[label] += time.perf_counter() - began
                COUNTS[label] += 1

    setattr(owner, name, wrapper)


def _profiled(owner: Any, name: str, path: str) -> None:
    """cProfile of every call of ``owner.name`` on the main thread, dumped to ``path`` at exit."""
    import atexit
    import cProfile

    profile = cProfile.Profile()
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        profile.enable()
        try:
            return original(*args, **kwargs)
        finally:
            profile.disable()

    setattr(owner, name, wrapper)
    atexit.register(profile.dump_stats, path)


def _thread_cpu_s(prefix: str) -> float:
    """User + system CPU seconds of this process's live threads whose name starts with ``prefix``."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for thread in threading.enumerate():
        if thread.name.startswith(prefix) and thread.native_id is not None:
            try:
                fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def main() -> None:
    variant, out_json = sys.argv[1], sys.argv[2]
    script = Path(__file__).resolve().parents[2] / "examples" / "spot_train.py"
    import datastates.llm
    import transformers
    from transformers import TrainerCallback

    if variant != "ckptlib":

        class NoCheckpointing:
            def __init__(self, runtime_config: Any, rank: int = -1) -> None:
                pass

        datastates.llm.DecoratedCheckpointing = NoCheckpointing  # type: ignore[attr-defined,misc]
    if variant == "none":
        os.environ["SPOT_SAVE_STEPS"] = "1000000"
        # The Trainer also saves at the last step when save_strategy is "steps".
        transformers.Trainer._save_checkpoint = lambda self, model, trial: None  # type: ignore[method-assign]

    step_ends: list[float] = []
    result: dict[str, Any] = {"variant": variant}

    # Paired cycles (``BENCH_SPOT_PAIRED``, e.g. "SNN"): whether the step that ends a save
    # cycle saves follows the pattern, one letter per cycle, instead of every cycle; set after
    # the Trainer's own flow callback has decided, so it is what the Trainer does next.
    pattern = os.environ.get("BENCH_SPOT_PAIRED", "")

    class StepClock(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            step_ends.append(time.perf_counter())
            if pattern:
                every = args.save_steps
                cycle = state.global_step // every
                control.should_save = state.global_step % every == 0 and pattern[cycle % len(pattern)] == "S"
            return control

    original_train = transformers.Trainer.train
    holder: dict[str, Any] = {}

    def train(self: Any, *args: Any, **kwargs: Any) -> Any:
        holder["trainer"] = self
        self.add_callback(StepClock())
        began, cpu_began = time.perf_counter(), time.process_time()
        try:
            return original_train(self, *args, **kwargs)
        finally:
            result["train_s"] = time.perf_counter() - began
            result["train_cpu_s"] = time.process_time() - cpu_began  # every thread of the process
            result["ckptlib_thread_cpu_s"] = _thread_cpu_s("ckptlib")

    transformers.Trainer.train = train  # type: ignore[method-assign]
    _timed(transformers.Trainer, "_save_checkpoint", "trainer_save_checkpoint")
    if variant == "ckptlib":
        import ckptlib._engine
        import ckptlib._hooks
        import ckptlib._trainer

        _timed(ckptlib._trainer.DecoratedCheckpointing, "_save_checkpoint", "save_checkpoint")
        # The small files are written on a writer thread; the training thread captures the state json.
        _timed(ckptlib._trainer.DecoratedCheckpointing, "_capture_trainer_state", "small_files")
        _timed(ckptlib._engine, "plan_state", "plan")
        _timed(ckptlib._engine.CheckpointEngine, "save", "engine_save")
        _timed(ckptlib._hooks.StagingPoints, "stage", "hooks")
        if os.environ.get("BENCH_SPOT_PROFILE"):
            _profiled(ckptlib._trainer.DecoratedCheckpointing, "_save_checkpoint", os.environ["BENCH_SPOT_PROFILE"])
    elif variant == "sync" and os.environ.get("BENCH_SPOT_PROFILE"):
        _profiled(transformers.Trainer, "_save_checkpoint", os.environ["BENCH_SPOT_PROFILE"])
    sys.argv = [str(script)]
    began = time.perf_counter()
    script_globals = runpy.run_path(str(script), run_name="__main__")
    result["script_s"] = time.perf_counter() - began
    trainer = holder["trainer"]
    result["steps"] = trainer.state.global_step
    result["save_steps"] = trainer.args.save_steps
    result["intervals"] = [b - a for a, b in pairwise(step_ends)]
    result["times"] = dict(TIMES)
    result["counts"] = dict(COUNTS)
    if variant == "ckptlib":
        engine = script_globals["ckpt_engine"].engine
        began = time.perf_counter()
        engine.wait(persist=True)  # what the exit hook waits for (not part of train_s)
        result["drain_s"] = time.perf_counter() - began
        results = engine.results
        result["blocking_s"] = [r.blocking_s for r in results]
        result["persist_s"] = [r.persist_s for r in results]
        result["bytes"] = [r.bytes for r in results]
    # What the page cache still holds of this run's writes once training is over: the Trainer's
    # save does not fsync, so on a run this short (dirty pages are written back after 30 s) its
    # checkpoints have not reached the disk when train() ends, and that write is in no figure
    # above. Timed here, after everything else: wall time and the whole machine's CPU time.
    cpu_began, began = _machine_cpu_s(), time.perf_counter()
    os.sync()
    result["writeback_s"] = time.perf_counter() - began
    result["writeback_cpu_s"] = _machine_cpu_s() - cpu_began
    Path(out_json).write_text(json.dumps(result))


def _machine_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy (``/proc/stat``: all but idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    busy = sum(fields) - fields[3] - fields[4]
    return busy / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()
