"""``python -m bench.ckpt``: checkpoint cost of ckptlib vs the Trainer's save vs DCP ``async_save``.

One run measures, on the same machine and disk:

* the raw sequential write bandwidth of the disk under the output directory (write + fsync);
* four training runs of the same model, each in a fresh process (so peak RSS is its own):
  ``none`` (no checkpoint), ``ckptlib``, ``trainer`` (``Trainer._save_checkpoint``, synchronous)
  and ``dcp`` (``torch.distributed.checkpoint.async_save``), a checkpoint every ``--every`` steps.

The model is a stack of 4096×4096 linear layers trained with AdamW, sized so parameters plus
optimizer state are ``--size-gb``.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

_WIDTH = 4096
_VARIANTS = ("none", "ckptlib", "trainer", "dcp")


@dataclass(frozen=True)
class RunFigures:
    variant: str
    state_bytes: int
    step_s: float
    blocking_s: list[float]
    persist_s: list[float]
    persist_bytes: list[int]
    peak_rss_bytes: int
    checkpoints: int


def _build(size_gb: float, seed: int = 0):  # noqa: ANN202
    import torch

    torch.manual_seed(seed)
    # params + exp_avg + exp_avg_sq = 3 × 4 bytes per parameter.
    layers = max(1, round(size_gb * 1e9 / (12 * (_WIDTH * _WIDTH + _WIDTH))))
    model = torch.nn.Sequential(*[torch.nn.Linear(_WIDTH, _WIDTH) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return model, optimizer, scheduler


def _state_bytes(model, optimizer) -> int:  # noqa: ANN001
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    moments = sum(
        t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if hasattr(t, "numel")
    )
    return params + moments


def _worker(variant: str, *, size_gb: float, steps: int, every: int, batch: int, out: Path) -> RunFigures:
    import torch

    model, optimizer, scheduler = _build(size_gb)
    inputs = torch.randn(batch, _WIDTH)
    blocking: list[float] = []
    persist: list[float] = []
    persist_bytes: list[int] = []
    save = _saver(variant, model, optimizer, scheduler, out, blocking, persist, persist_bytes, size_gb)
    step_times = []
    for step in range(1, steps + 1):
        began = time.perf_counter()
        loss = model(inputs).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        scheduler.step()
        if step % every == 0:
            save(step)
        step_times.append(time.perf_counter() - began)
    finish = getattr(save, "finish", None)
    if finish is not None:
        finish()
    # Step 1 allocates the optimizer state; later steps are the steady state.
    steady = step_times[1:]
    if os.environ.get("BENCH_CKPT_STEPS"):
        print(" ".join(f"{t:.2f}" for t in step_times), file=sys.stderr)
    return RunFigures(
        variant=variant,
        state_bytes=_state_bytes(model, optimizer),
        step_s=sum(steady) / len(steady),
        blocking_s=blocking,
        persist_s=persist,
        persist_bytes=persist_bytes,
        peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        checkpoints=len(blocking),
    )


def _saver(variant, model, optimizer, scheduler, out, blocking, persist, persist_bytes, size_gb):  # noqa: ANN001, ANN202, PLR0913
    import torch

    if variant == "none":
        return lambda step: None

    if variant == "ckptlib":
        import ckptlib

        engine = ckptlib.CheckpointEngine(output_dir=out, host_cache_size=size_gb * 1.05, handle_signals=False)
        engine.on_commit.append(lambda r: (persist.append(r.persist_s), persist_bytes.append(r.bytes)))

        def save(step: int) -> None:
            engine.save({"model": model, "optimizer": optimizer, "scheduler": scheduler}, step=step)

        def finish() -> None:
            engine.shutdown()
            blocking.extend(r.blocking_s for r in engine.results)

        save.finish = finish  # type: ignore[attr-defined]
        return save

    if variant == "trainer":
        from transformers import Trainer, TrainingArguments

        args = TrainingArguments(output_dir=str(out), report_to="none", use_cpu=True)
        trainer = Trainer(model=model, args=args, optimizers=(optimizer, scheduler))

        def save(step: int) -> None:
            trainer.state.global_step = step
            began = time.perf_counter()
            trainer._save_checkpoint(model, None)
            elapsed = time.perf_counter() - began
            blocking.append(elapsed)
            persist.append(elapsed)
            folder = out / f"checkpoint-{step}"
            persist_bytes.append(sum(p.stat().st_size for p in folder.iterdir()))

        return save

    if variant == "dcp":
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        if not dist.is_initialized():
            dist.init_process_group("gloo", init_method=f"file://{out}/.pg", rank=0, world_size=1)
        pending: list = []

        def wait_previous() -> None:
            while pending:
                began_step, future, step_bytes = pending.pop()
                future.result()
                persist.append(time.perf_counter() - began_step)
                persist_bytes.append(step_bytes)

        def save(step: int) -> None:
            began = time.perf_counter()
            wait_previous()
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            future = dcp.async_save(state, checkpoint_id=str(out / f"checkpoint-{step}"))
            blocking.append(time.perf_counter() - began)
            pending.append((began, future, _state_bytes(model, optimizer)))

        def finish() -> None:
            wait_previous()

        save.finish = finish  # type: ignore[attr-defined]
        return save

    raise ValueError(f"unknown variant {variant!r}")


def raw_write_bandwidth(directory: Path, nbytes: int) -> float:
    """Bytes per second of one sequential write of ``nbytes`` then fsync: the faster of buffered
    writes (``dd conv=fsync``) and direct I/O (``dd oflag=direct conv=fsync``), 64 MiB at a time."""
    chunk = mmap.mmap(-1, 64 << 20)  # page-aligned, as O_DIRECT needs
    chunk.write(os.urandom(1 << 20) * 64)
    view = memoryview(chunk)
    path = directory / "raw-bandwidth.bin"
    best = 0.0
    for flags in (0, getattr(os, "O_DIRECT", 0)):
        began = time.perf_counter()
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flags, 0o644)
        except OSError:
            continue
        try:
            written = 0
            while written < nbytes:
                written += os.write(fd, view[: min(len(view), nbytes - written)])
            os.fsync(fd)
        except OSError:
            continue
        finally:
            os.close(fd)
            path.unlink()
        best = max(best, nbytes / (time.perf_counter() - began))
    view.release()
    chunk.close()
    return best


def _run_variant(variant: str, options: argparse.Namespace, workdir: Path) -> RunFigures:
    out = workdir / variant
    out.mkdir()
    command = [
        sys.executable, "-m", "bench.ckpt", "--worker", variant, "--out", str(out),
        "--size-gb", str(options.size_gb), "--steps", str(options.steps),
        "--every", str(options.every), "--batch", str(options.batch),
    ]  # fmt: skip
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    shutil.rmtree(out, ignore_errors=True)
    if completed.returncode != 0:
        sys.stderr.write(completed.stderr[-4000:])
        raise SystemExit(f"variant {variant} failed ({completed.returncode})")
    line = [row for row in completed.stdout.splitlines() if row.startswith("{")][-1]
    return RunFigures(**json.loads(line))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _report(figures: dict[str, RunFigures], raw_bw: float, options: argparse.Namespace) -> str:
    gb = 1e9
    state = figures["ckptlib"].state_bytes
    base_step = figures["none"].step_s
    lines = [
        f"state size: {state / gb:.2f} GB  steps: {options.steps}  checkpoint every {options.every} steps  "
        f"batch: {options.batch}  host_cache_size: {options.size_gb * 1.05:.2f} GB",
        f"raw sequential write bandwidth (write+fsync, best of buffered and direct): {raw_bw / 1e6:.0f} MB/s",
        "",
        f"{'variant':<9} {'step s':>8} {'overhead':>9} {'blocking s/ckpt':>16} {'persist s':>10} {'persist MB/s':>13} {'peak RSS GB':>12}",
    ]
    for name in _VARIANTS:
        run = figures[name]
        throughput = _mean([b / s for b, s in zip(run.persist_bytes, run.persist_s, strict=False) if s > 0])
        overhead = (run.step_s / base_step - 1) * 100
        lines.append(
            f"{name:<9} {run.step_s:>8.3f} {overhead:>8.1f}% {_mean(run.blocking_s):>16.4f} "
            f"{_mean(run.persist_s):>10.2f} {throughput / 1e6:>13.0f} {run.peak_rss_bytes / gb:>12.2f}"
        )
    ck, tr, dc = figures["ckptlib"], figures["trainer"], figures["dcp"]
    ck_block = _mean(ck.blocking_s)
    ck_throughput = _mean([b / s for b, s in zip(ck.persist_bytes, ck.persist_s, strict=False) if s > 0])
    rss_bound = (state + options.size_gb * 1.05 * gb) * 1.1
    checks = [
        ("blocking >= 20x lower than Trainer sync save", _mean(tr.blocking_s) / ck_block, _mean(tr.blocking_s) / ck_block >= 20),
        ("blocking lower than DCP async_save (x lower)", _mean(dc.blocking_s) / ck_block, ck_block < _mean(dc.blocking_s)),
        (f"step-time overhead <= 3% (ckpt every {options.every})", (ck.step_s / base_step - 1) * 100, ck.step_s / base_step - 1 <= 0.03),
        ("persist throughput >= 80% of raw disk (%)", ck_throughput / raw_bw * 100, ck_throughput / raw_bw >= 0.8),
        ("peak RSS <= (state + host_cache) * 1.1 (GB)", ck.peak_rss_bytes / gb, ck.peak_rss_bytes <= rss_bound),
        ("peak RSS over the no-checkpoint run (GB)", (ck.peak_rss_bytes - figures["none"].peak_rss_bytes) / gb, True),
    ]
    lines += ["", "ckptlib against the targets:"]
    for label, value, ok in checks:
        lines.append(f"  {'PASS' if ok else 'FAIL'}  {label}: {value:.2f}")
    lines.append(f"  (RSS bound = {rss_bound / gb:.2f} GB)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ckpt", description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=2.0, help="parameters + optimizer state, GB (default 2)")
    parser.add_argument("--steps", type=int, default=21, help="training steps per variant (default 21)")
    parser.add_argument("--every", type=int, default=10, help="checkpoint every N steps (default 10)")
    parser.add_argument("--batch", type=int, default=128, help="batch size (default 128)")
    parser.add_argument("--dir", default=None, help="where checkpoints are written (default: a temp dir)")
    parser.add_argument("--variants", default=",".join(_VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--worker", choices=_VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)

    if options.worker:
        figures = _worker(
            options.worker, size_gb=options.size_gb, steps=options.steps, every=options.every,
            batch=options.batch, out=Path(options.out),
        )  # fmt: skip
        print(json.dumps(asdict(figures)), flush=True)
        return 0

    workdir = Path(tempfile.mkdtemp(prefix="bench-ckpt-", dir=options.dir))
    try:
        raw_bw = raw_write_bandwidth(workdir, int(options.size_gb * 1e9))
        print(f"raw disk bandwidth: {raw_bw / 1e6:.0f} MB/s", flush=True)
        figures = {}
        for variant in _VARIANTS:
            began = time.perf_counter()
            figures[variant] = _run_variant(variant, options, workdir)
            print(f"{variant}: done in {time.perf_counter() - began:.0f}s", flush=True)
        print()
        print(_report(figures, raw_bw, options))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
