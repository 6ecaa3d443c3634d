"""``python -m bench.ckpt``: checkpoint cost of ckptlib vs the Trainer's save vs DCP ``async_save``.

One run measures, on the same machine and disk:

* the raw sequential write bandwidth of the disk under the output directory (write + fsync);
* training runs of the same model, each in a fresh process (so peak RSS is its own): ``--rounds``
  pairs of ``none`` (no checkpoint) then ``ckptlib``, then one ``trainer``
  (``Trainer._save_checkpoint``, synchronous) and one ``dcp``
  (``torch.distributed.checkpoint.async_save``), a checkpoint every ``--every`` steps. Step times
  on a shared machine drift by a few percent from run to run, so ckptlib's step-time overhead is
  taken against the no-checkpoint run just before it, and the median over the rounds is judged.

Every run has ``THP_MEM_ALLOC_ENABLE=1``, as the console runs jobs (``--no-thp`` runs without it).

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
    """Bytes per second of one sequential write of ``nbytes`` then fsync: the fastest of one
    buffered write (``dd conv=fsync``) and two with direct I/O (``dd oflag=direct conv=fsync``),
    64 MiB at a time."""
    chunk = mmap.mmap(-1, 64 << 20)  # page-aligned, as O_DIRECT needs
    chunk.write(os.urandom(1 << 20) * 64)
    view = memoryview(chunk)
    path = directory / "raw-bandwidth.bin"
    best = 0.0
    direct = getattr(os, "O_DIRECT", 0)
    for flags in (0, direct, direct):  # direct I/O twice: the better of two tries
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
    env = dict(os.environ)
    if options.no_thp:
        env.pop("THP_MEM_ALLOC_ENABLE", None)
    else:
        # As the console runs every job: torch allocates large CPU tensors page-aligned (and on
        # huge pages), which lets ckptlib write them straight from memory.
        env["THP_MEM_ALLOC_ENABLE"] = "1"
    completed = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    shutil.rmtree(out, ignore_errors=True)
    if completed.returncode != 0:
        sys.stderr.write(completed.stderr[-4000:])
        raise SystemExit(f"variant {variant} failed ({completed.returncode})")
    line = [row for row in completed.stdout.splitlines() if row.startswith("{")][-1]
    return RunFigures(**json.loads(line))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _throughput(run: RunFigures) -> float:
    return _mean([b / s for b, s in zip(run.persist_bytes, run.persist_s, strict=False) if s > 0])


def _report(runs: dict[str, list[RunFigures]], raw_bw: float, options: argparse.Namespace) -> str:
    gb = 1e9
    state = runs["ckptlib"][0].state_bytes
    nones = runs["none"]
    # ckptlib's overhead in each round is against that round's no-checkpoint run (run just before
    # it); the Trainer's and DCP's (one run each) against the median no-checkpoint run.
    base_step = _median([run.step_s for run in nones])
    overheads = {
        name: [
            (run.step_s / (base.step_s if name in ("none", "ckptlib") else base_step) - 1) * 100
            for run, base in zip(runs[name], nones, strict=False)
        ]
        for name in _VARIANTS
    }
    lines = [
        f"state size: {state / gb:.2f} GB  steps: {options.steps}  checkpoint every {options.every} steps  "
        f"batch: {options.batch}  host_cache_size: {options.size_gb * 1.05:.2f} GB  rounds: {options.rounds}  "
        f"THP_MEM_ALLOC_ENABLE: {'0' if options.no_thp else '1'}",
        f"raw sequential write bandwidth (write+fsync, best of buffered and direct): {raw_bw / 1e6:.0f} MB/s",
        "",
        f"{'variant':<9} {'step s':>8} {'overhead (per round)':>24} {'blocking s/ckpt':>16} {'persist s':>10} "
        f"{'persist MB/s':>13} {'peak RSS GB':>12}",
    ]
    for name in _VARIANTS:
        group = runs[name]
        per_round = " ".join(f"{value:+.1f}" for value in overheads[name])
        lines.append(
            f"{name:<9} {_mean([r.step_s for r in group]):>8.3f} {per_round:>24} "
            f"{_mean([b for r in group for b in r.blocking_s]):>16.4f} "
            f"{_mean([p for r in group for p in r.persist_s]):>10.2f} "
            f"{_mean([_throughput(r) for r in group]) / 1e6:>13.0f} {max(r.peak_rss_bytes for r in group) / gb:>12.2f}"
        )
    ck_block = _mean([b for r in runs["ckptlib"] for b in r.blocking_s])
    tr_block = _mean([b for r in runs["trainer"] for b in r.blocking_s])
    dc_block = _mean([b for r in runs["dcp"] for b in r.blocking_s])
    ck_overhead = _median(overheads["ckptlib"])
    ck_throughput = _mean([_throughput(r) for r in runs["ckptlib"]])
    ck_rss = max(r.peak_rss_bytes for r in runs["ckptlib"])
    none_rss = max(r.peak_rss_bytes for r in nones)
    rss_bound = (state + options.size_gb * 1.05 * gb) * 1.1
    checks = [
        ("blocking >= 20x lower than Trainer sync save (x lower)", tr_block / ck_block, tr_block / ck_block >= 20),
        ("blocking lower than DCP async_save (x lower)", dc_block / ck_block, ck_block < dc_block),
        (f"step-time overhead <= 3% (ckpt every {options.every}; median of rounds, %)", ck_overhead, ck_overhead <= 3),
        ("persist throughput >= 80% of raw disk (%)", ck_throughput / raw_bw * 100, ck_throughput / raw_bw >= 0.8),
        ("peak RSS <= (state + host_cache) * 1.1 (GB)", ck_rss / gb, ck_rss <= rss_bound),
    ]
    lines += ["", "ckptlib against the targets:"]
    for label, value, ok in checks:
        lines.append(f"  {'PASS' if ok else 'FAIL'}  {label}: {value:.2f}")
    lines.append(f"  (RSS bound = {rss_bound / gb:.2f} GB; ckptlib's peak RSS over the no-checkpoint run: "
                 f"{(ck_rss - none_rss) / gb:+.2f} GB)")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ckpt", description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=2.0, help="parameters + optimizer state, GB (default 2)")
    parser.add_argument("--steps", type=int, default=31, help="training steps per run (default 31)")
    parser.add_argument("--every", type=int, default=10, help="checkpoint every N steps (default 10)")
    parser.add_argument("--batch", type=int, default=128, help="batch size (default 128)")
    parser.add_argument(
        "--rounds", type=int, default=5,
        help="rounds of (no checkpoint, ckptlib) runs; the overhead is the median of the rounds (default 5)",
    )  # fmt: skip
    parser.add_argument(
        "--no-thp", action="store_true",
        help="run without THP_MEM_ALLOC_ENABLE=1 (ckptlib then copies every byte before writing it)",
    )  # fmt: skip
    parser.add_argument("--dir", default=None, help="where checkpoints are written (default: a temp dir)")
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
        runs: dict[str, list[RunFigures]] = {name: [] for name in _VARIANTS}
        order = [("none", "ckptlib")] * options.rounds + [("trainer", "dcp")]
        for round_variants in order:
            for variant in round_variants:
                began = time.perf_counter()
                runs[variant].append(_run_variant(variant, options, workdir))
                print(f"{variant}: done in {time.perf_counter() - began:.0f}s", flush=True)
        print()
        print(_report(runs, raw_bw, options))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
