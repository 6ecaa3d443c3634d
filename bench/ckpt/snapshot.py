"""``python -m bench.ckpt.snapshot``: what in-memory snapshots every step cost a training step.

One process trains a small MLP (``--width`` hidden units, a few MB of parameters and Adam state,
~20–50 ms a step on one CPU thread) and alternates windows of ``--window`` steps with a snapshot
after every optimizer step (``CheckpointEngine.snapshot`` into a tmpfs directory, ``/dev/shm``,
as the platform mounts ``CKPT_SNAPSHOT_DIR``) and windows without, for ``--cycles`` pairs, after a
warm-up window. Alternating windows in one process see the same drift of a shared machine, so it
cancels out of the ratio. Torch runs on one thread (``torch.set_num_threads(1)``), so a core stays
free for the snapshot's writer thread.

It prints, for each kind of window, the median step time, its p5–p95 and interquartile spread and
the mean, then the cost: the with-snapshot median (and mean) over the without-snapshot one, and
how many snapshots were taken or skipped because the previous one was still in flight.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from bench.stats import quantile
from ckptlib import CheckpointEngine


def _spread(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (
        f"median {statistics.median(ms):7.2f} ms  p5–p95 {quantile(ms, 0.05):7.2f}–{quantile(ms, 0.95):7.2f}  "
        f"IQR {quantile(ms, 0.25):7.2f}–{quantile(ms, 0.75):7.2f}  mean {statistics.fmean(ms):7.2f}  (n={len(ms)})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--width", type=int, default=768, help="hidden units of the MLP's layers")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--window", type=int, default=20, help="steps per window")
    parser.add_argument("--cycles", type=int, default=12, help="pairs of windows (with, without)")
    parser.add_argument("--memory-dir", default="/dev/shm", help="tmpfs directory the snapshots go under")
    options = parser.parse_args(argv)

    torch.set_num_threads(1)
    torch.manual_seed(0)
    width = options.width
    model = nn.Sequential(nn.Linear(64, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(options.batch, 64), torch.randn(options.batch, 1)
    state = {"model": model, "optimizer": optimizer}
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())

    memory = Path(tempfile.mkdtemp(prefix="ckptlib-bench-snapshot-", dir=options.memory_dir))
    output = Path(tempfile.mkdtemp(prefix="ckptlib-bench-snapshot-out-"))
    engine = CheckpointEngine(output_dir=output, host_cache_size=1, parser_threads=1, handle_signals=False, snapshot_dir=memory)
    times: dict[bool, list[float]] = {True: [], False: []}
    taken = skipped = 0
    step = 0
    try:
        for cycle in range(options.cycles + 1):
            for with_snapshots in (True, False):
                for _ in range(options.window):
                    step += 1
                    began = time.perf_counter()
                    optimizer.zero_grad()
                    loss = nn.functional.mse_loss(model(x), y)
                    loss.backward()
                    optimizer.step()
                    if with_snapshots:
                        if engine.snapshot(state, step=step):
                            taken += 1
                        else:
                            skipped += 1
                    loss.item()
                    elapsed = time.perf_counter() - began
                    if cycle > 0:  # the first pair warms up (Adam's state, the allocator, the cache)
                        times[with_snapshots].append(elapsed)
        engine.shutdown()
    finally:
        shutil.rmtree(memory, ignore_errors=True)
        shutil.rmtree(output, ignore_errors=True)

    with_s, without_s = times[True], times[False]
    print(f"model: width {width}, {parameters / 2**20:.1f} MiB of parameters (+2× Adam state), batch {options.batch}, 1 torch thread")
    print(f"snapshots into {options.memory_dir}: {options.cycles} pairs of {options.window}-step windows after a warm-up pair")
    print(f"  with a snapshot every step   {_spread(with_s)}")
    print(f"  without                      {_spread(without_s)}")
    median_ratio = statistics.median(with_s) / statistics.median(without_s)
    mean_ratio = statistics.fmean(with_s) / statistics.fmean(without_s)
    print(f"  cost: median ×{median_ratio:.3f} ({(median_ratio - 1) * 100:+.1f} %), mean ×{mean_ratio:.3f} ({(mean_ratio - 1) * 100:+.1f} %)")
    print(f"  snapshots taken {taken}, skipped (previous still in flight) {skipped}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
