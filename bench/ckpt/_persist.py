"""Persist against the raw disk, measured alike: ``python -m bench.ckpt --persist-only``.

Both figures are bytes over seconds from the first call to the last fsync, on the same disk, in
the same process, alternating:

* persist: one ckptlib ``save`` of the bench model (parameters, AdamW state, scheduler), timed by
  ckptlib itself from the ``save`` call to the commit (every file written, fsynced, renamed,
  the directory fsynced): ``CheckpointResult.persist_s`` over ``CheckpointResult.bytes``, the
  bytes the writers wrote for that checkpoint. Each save waits for the previous commit (nothing
  of one checkpoint is written before the next one's clock starts), and training steps between
  saves change the state (no write of unchanged bytes is skipped);
* raw: the same number of bytes written as ckptlib writes them, by as many threads as the
  engine's writers, each creating, writing (direct I/O, 64 MiB per call) and fsyncing one file
  (``raw_write_bandwidth``), one sample just before and one just after each save, after one
  warm-up sample that is not counted (the first write after a commit met a cold disk queue and
  ran at a fifth of the others' rate).

The bench's main run measures persist while training goes on (the overhead windows); there the
writer shares the cores with training, so its figure says less about the disk than this one.
Figures: total bytes over total seconds for each, the spread of the per-sample rates, and the
ratio persist / raw.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PersistFigures:
    persist_bytes: list[int]
    persist_s: list[float]
    raw_bytes: list[int]
    raw_s: list[float]

    @property
    def persist_rate(self) -> float:
        return sum(self.persist_bytes) / sum(self.persist_s)

    @property
    def raw_rate(self) -> float:
        return sum(self.raw_bytes) / sum(self.raw_s)

    @property
    def ratio(self) -> float:
        return self.persist_rate / self.raw_rate

    def rates(self, kind: str) -> list[float]:
        pairs = zip(self.persist_bytes, self.persist_s, strict=True) if kind == "persist" else zip(self.raw_bytes, self.raw_s, strict=True)
        return [b / s for b, s in pairs]

    @property
    def spread(self) -> float:
        """Relative spread of the raw samples, (max - min) / their overall rate."""
        raw = self.rates("raw")
        return (max(raw) - min(raw)) / self.raw_rate

    def report(self) -> str:
        def shown(kind: str) -> str:
            rates = self.rates(kind)
            return f"min {min(rates) / 1e6:.0f}, max {max(rates) / 1e6:.0f} [{' '.join(f'{r / 1e6:.0f}' for r in rates)}]"

        return "\n".join(
            [
                "persist vs raw, measured alike (save call -> commit's fsync; create -> write -> fsync):",
                f"  persist {self.persist_rate / 1e6:.0f} MB/s ({shown('persist')}) over {len(self.persist_s)} saves of {self.persist_bytes[0] / 1e6:.0f} MB",
                f"  raw     {self.raw_rate / 1e6:.0f} MB/s ({shown('raw')}) over {len(self.raw_s)} samples",
                f"  ratio persist/raw {self.ratio * 100:.0f} % (raw spread {self.spread * 100:.0f} %)",
            ]
        )


def measure(size_gb: float, saves: int, directory: Path | None = None, batch: int = 16) -> PersistFigures:
    import torch

    import ckptlib
    from bench.ckpt.__main__ import _WIDTH, _build

    model, optimizer, scheduler = _build(size_gb)
    inputs = torch.randn(batch, _WIDTH)

    def train() -> None:
        model(inputs).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        scheduler.step()

    figures = PersistFigures([], [], [], [])
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-persist-", dir=directory) as workdir:
        root = Path(workdir)
        engine = ckptlib.CheckpointEngine(output_dir=root / "ckpt", host_cache_size=size_gb * 1.05, handle_signals=False)
        writers = engine.options.parser_threads
        try:
            train()
            for step in range(1, saves + 1):
                train()
                nbytes = figures.persist_bytes[-1] if figures.persist_bytes else None
                if nbytes is not None:
                    _raw(figures, root, nbytes, writers)
                engine.save({"model": model, "optimizer": optimizer, "scheduler": scheduler}, step=step)
                [result] = engine.wait(persist=True)
                if not result.committed:
                    raise RuntimeError(f"checkpoint {step} not committed: {result.error}")
                figures.persist_bytes.append(result.bytes)
                figures.persist_s.append(result.persist_s)
                if step == 1:
                    _raw(None, root, result.bytes, writers)  # warm-up, not counted
                _raw(figures, root, result.bytes, writers)
        finally:
            engine.shutdown()
    return figures


def _raw(figures: PersistFigures | None, root: Path, nbytes: int, writers: int) -> None:
    from bench.ckpt.__main__ import raw_write_bandwidth

    rate = raw_write_bandwidth(root, nbytes, writers)
    if figures is None:
        return
    figures.raw_bytes.append(nbytes)
    figures.raw_s.append(nbytes / rate)
