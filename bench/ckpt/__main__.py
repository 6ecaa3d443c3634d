"""``python -m bench.ckpt``: checkpoint cost of ckptlib vs the Trainer's save vs DCP ``async_save``.

One run measures, on the same machine and disk:

* the raw sequential write bandwidth of the disk under the output directory (create, write and
  fsync of a file of the checkpoint's size, direct I/O; two samples before each ckptlib run);
* training runs of the same model, each in a fresh process (so peak RSS is its own): ``--rounds``
  pairs of ``none`` (no checkpoint) then ``ckptlib``, then one ``trainer``
  (``Trainer._save_checkpoint``, synchronous) and one ``dcp``
  (``torch.distributed.checkpoint.async_save``).

Step-time overhead with one checkpoint every ``--every`` (N) steps is measured inside each run, in
paired windows: after a warm-up window (the optimizer state is allocated, the allocator warms up)
the run alternates a window of N steps that starts with a checkpoint (taken after that step's
optimizer step, as the Trainer does; its blocking time counts in that step) and a window of N steps
without one, for ``--cycles`` pairs. The overhead is the mean step time of the windows with a
checkpoint over that of the windows without, pooled over the rounds. Step times on a shared VM drift
by several percent over tens of seconds and between processes; windows of ~10 s that alternate in
one process see the same drift, so it cancels out. The same figure for the ``none`` runs (no
checkpoint in either kind of window) is printed as the noise floor, and each run's mean step time
against the no-checkpoint run's is printed too. A checkpoint that is still persisting when its
window ends would spill its cost into the next one: the report marks such a variant "(spills)".

Every run has ``THP_MEM_ALLOC_ENABLE=1``, as the console runs jobs (``--no-thp`` runs without it),
and runs with jemalloc preloaded where it is installed (Debian: ``libjemalloc2``; ``--allocator
glibc`` runs without). Not for ckptlib's sake: with glibc's malloc, torch maps and unmaps the
backward pass's large temporaries every step, and their fresh huge-page faults make step times on
the development VM spread from 0.83 s to 1.5 s with no checkpointing at all (0.83–0.99 s with
jemalloc, which keeps the pages), a noise several times the 3 % being measured.

The model is a stack of 4096×4096 linear layers trained with fused AdamW (the Trainer's default
optimizer, ``adamw_torch_fused``), sized so parameters plus optimizer state are ``--size-gb``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes.util
import json
import mmap
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

_WIDTH = 4096
_VARIANTS = ("none", "ckptlib", "trainer", "dcp")


@dataclass(frozen=True)
class RunFigures:
    variant: str
    state_bytes: int
    step_s: float
    step_times: list[float]
    save_steps: list[int]
    blocking_s: list[float]
    persist_s: list[float]
    persist_bytes: list[int]
    peak_rss_bytes: int
    checkpoints: int
    # Seconds inside each save call (blocking_s also counts the hooks' waits after it).
    save_call_s: list[float] = field(default_factory=list)


def _build(size_gb: float, seed: int = 0):
    import torch

    torch.manual_seed(seed)
    # params + exp_avg + exp_avg_sq = 3 × 4 bytes per parameter.
    layers = max(1, round(size_gb * 1e9 / (12 * (_WIDTH * _WIDTH + _WIDTH))))
    model = torch.nn.Sequential(*[torch.nn.Linear(_WIDTH, _WIDTH) for _ in range(layers)])
    # Fused AdamW: the Trainer's default optimizer (adamw_torch_fused). The foreach AdamW allocates
    # and frees ~0.7 GB of temporaries every step, whose page faults make step times on this VM
    # spread from 1.05 s to 2.4 s with no checkpointing at all.
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return model, optimizer, scheduler


def _state_bytes(model, optimizer) -> int:
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    moments = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if hasattr(t, "numel"))
    return params + moments


def _steps(every: int, cycles: int) -> int:
    """A warm-up window, then ``cycles`` pairs of a window with a checkpoint and one without."""
    return every + 2 * every * cycles


def _saves_at(step: int, every: int) -> bool:
    """Whether ``step`` starts a window with a checkpoint (steps count from 1)."""
    return step > every and (step - every - 1) % (2 * every) == 0


def _window_means(step_times: list[float], every: int) -> tuple[float, float]:
    """Mean step time of the windows with a checkpoint and of those without, after the warm-up
    window (the first steps allocate the optimizer state and warm the allocator)."""
    timed = step_times[every:]
    with_ckpt = [t for i, t in enumerate(timed) if (i // every) % 2 == 0]
    without = [t for i, t in enumerate(timed) if (i // every) % 2 == 1]
    return _mean(with_ckpt), _mean(without)


def _worker(variant: str, *, size_gb: float, steps: int, every: int, batch: int, out: Path, copy_mode: str | None = None) -> RunFigures:
    import torch

    model, optimizer, scheduler = _build(size_gb)
    inputs = torch.randn(batch, _WIDTH)
    blocking: list[float] = []
    persist: list[float] = []
    persist_bytes: list[int] = []
    save = _saver(variant, model, optimizer, scheduler, out, blocking, persist, persist_bytes, size_gb, copy_mode)
    step_times = []
    save_steps = []
    save_call: list[float] = []
    for step in range(1, steps + 1):
        began = time.perf_counter()
        loss = model(inputs).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        scheduler.step()
        if _saves_at(step, every):
            called = time.perf_counter()
            save(step)
            save_call.append(time.perf_counter() - called)
            save_steps.append(step)
        step_times.append(time.perf_counter() - began)
    finish = getattr(save, "finish", None)
    if finish is not None:
        finish()
    # The warm-up window allocates the optimizer state; later steps are the steady state.
    steady = step_times[every:]
    return RunFigures(
        variant=variant,
        state_bytes=_state_bytes(model, optimizer),
        step_s=sum(steady) / len(steady),
        step_times=step_times,
        save_steps=save_steps,
        blocking_s=blocking,
        persist_s=persist,
        persist_bytes=persist_bytes,
        peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        checkpoints=len(blocking),
        save_call_s=save_call,
    )


def _saver(variant, model, optimizer, scheduler, out, blocking, persist, persist_bytes, size_gb, copy_mode=None):

    if variant == "none":
        return lambda step: None

    if variant == "ckptlib":
        import ckptlib

        # copy_mode only where asked (bench.ckpt.compare): an earlier ckptlib may not have it.
        modes = {} if copy_mode is None else {"copy_mode": copy_mode}
        engine = ckptlib.CheckpointEngine(output_dir=out, host_cache_size=size_gb * 1.05, handle_signals=False, **modes)
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
                pending.pop().result()

        def save(step: int) -> None:
            began = time.perf_counter()
            wait_previous()
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            future = dcp.async_save(state, checkpoint_id=str(out / f"checkpoint-{step}"))
            blocking.append(time.perf_counter() - began)
            step_bytes = _state_bytes(model, optimizer)
            # Persisted when the future completes, not when the next save looks at it.
            future.add_done_callback(lambda _f: (persist.append(time.perf_counter() - began), persist_bytes.append(step_bytes)))
            pending.append(future)

        def finish() -> None:
            wait_previous()
            # A future's done-callbacks run just after its waiters wake: let the last one record.
            deadline = time.monotonic() + 5
            while len(persist) < len(blocking) and time.monotonic() < deadline:
                time.sleep(0.01)

        save.finish = finish  # type: ignore[attr-defined]
        return save

    raise ValueError(f"unknown variant {variant!r}")


def raw_write_bandwidth(directory: Path, nbytes: int, writers: int = 1) -> float:
    """Bytes per second of a sequential write of ``nbytes`` then fsync, timed like persist and
    written like it: ``writers`` threads (the engine's ``parser_threads``) each create,
    write (direct I/O, 64 MiB at a time; buffered where the filesystem refuses ``O_DIRECT``) and
    fsync one file of an equal share, the clock running from the first creation to the last
    fsync. A single-stream raw figure undercounts a disk that serves several queues, and persist
    then reads above 100 % of it. The files' removal is not timed (persist removes nothing). One
    sample; ``main`` takes one before each ckptlib run, at the checkpoint's size."""
    chunk = mmap.mmap(-1, 64 << 20)  # page-aligned, as O_DIRECT needs
    chunk.write(os.urandom(1 << 20) * 64)
    view = memoryview(chunk)
    writers = max(1, writers)
    # Shares in whole 4 KiB pages (O_DIRECT), the last share taking the remainder.
    page_share = (nbytes // writers) & ~4095
    shares = [page_share] * (writers - 1) + [nbytes - page_share * (writers - 1)]
    paths = [directory / f"raw-bandwidth-{index}.bin" for index in range(writers)]

    def write_one(path: Path, size: int, flags: int) -> None:
        # As ckptlib's writer: whole pages with O_DIRECT, an unaligned tail through a buffered fd.
        aligned = size & ~4095 if flags else size
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flags, 0o644)
        try:
            written = 0
            while written < aligned:
                written += os.write(fd, view[: min(len(view), aligned - written)])
            if aligned < size:
                tail = os.open(path, os.O_WRONLY)
                try:
                    os.pwrite(tail, view[: size - aligned], aligned)
                finally:
                    os.close(tail)
            os.fsync(fd)  # the file's data, whichever descriptor wrote it
        finally:
            os.close(fd)

    try:
        for flags in (getattr(os, "O_DIRECT", 0), 0):
            began = time.perf_counter()
            try:
                with concurrent.futures.ThreadPoolExecutor(writers) as pool:
                    for future in [pool.submit(write_one, path, size, flags) for path, size in zip(paths, shares, strict=True)]:
                        future.result()
            except OSError:
                continue  # O_DIRECT refused (or an unaligned tail): buffered
            elapsed = time.perf_counter() - began
            return nbytes / elapsed
        return float("nan")
    finally:
        for path in paths:
            path.unlink(missing_ok=True)
        view.release()
        chunk.close()


def _spread(values: list[float], scale: float = 1.0) -> str:
    shown = [f"{value / scale:.0f}" for value in values]
    return f"min {min(values) / scale:.0f}, max {max(values) / scale:.0f} [{' '.join(shown)}]" if values else "none"


def _run_variant(variant: str, options: argparse.Namespace, workdir: Path) -> RunFigures:
    out = workdir / variant
    out.mkdir()
    command = [
        sys.executable, "-m", "bench.ckpt", "--worker", variant, "--out", str(out),
        "--size-gb", str(options.size_gb), "--cycles", str(options.cycles),
        "--every", str(options.every), "--batch", str(options.batch),
    ]  # fmt: skip
    env = dict(os.environ)
    if options.allocator != "glibc":
        env["LD_PRELOAD"] = " ".join(filter(None, [options.allocator, env.get("LD_PRELOAD", "")]))
    if options.no_thp:
        env.pop("THP_MEM_ALLOC_ENABLE", None)
    else:
        # As the console runs every job: torch allocates large CPU tensors page-aligned (and on
        # huge pages), which lets ckptlib write them straight from memory.
        env["THP_MEM_ALLOC_ENABLE"] = "1"
    return _worker_figures(command, env, out, f"variant {variant}")


def _worker_figures(command: list[str], env: dict[str, str], out: Path, what: str, cwd: Path | None = None) -> RunFigures:
    """Runs one worker process, removes its output directory and returns the figures of its last
    JSON line; exits naming ``what`` if it failed."""
    completed = subprocess.run(command, capture_output=True, text=True, check=False, env=env, cwd=cwd)
    shutil.rmtree(out, ignore_errors=True)
    if completed.returncode != 0:
        sys.stderr.write(completed.stderr[-4000:])
        raise SystemExit(f"{what} failed ({completed.returncode})")
    line = [row for row in completed.stdout.splitlines() if row.startswith("{")][-1]
    return RunFigures(**json.loads(line))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _throughput(run: RunFigures) -> float:
    """Bytes over seconds of all the run's checkpoints (not a mean of per-save rates, which a
    few short saves would pull up)."""
    seconds = sum(run.persist_s)
    return sum(run.persist_bytes[: len(run.persist_s)]) / seconds if seconds > 0 else float("nan")


def _paired_overhead(group: list[RunFigures], every: int) -> tuple[float, list[float]]:
    """Pooled and per-run overhead (%) of the windows with a checkpoint over those without."""
    pairs = [_window_means(run.step_times, every) for run in group]
    per_run = [(with_ckpt / without - 1) * 100 for with_ckpt, without in pairs]
    pooled = (_mean([w for w, _ in pairs]) / _mean([o for _, o in pairs]) - 1) * 100
    return pooled, per_run


def _spills(run: RunFigures, every: int) -> bool:
    """Whether some checkpoint was still persisting when its window ended."""
    for save_step, persist_s in zip(run.save_steps, run.persist_s, strict=False):
        # step_times[save_step - 1] is the save step; the window's later steps follow it.
        window_rest = sum(run.step_times[save_step : save_step - 1 + every])
        if persist_s > window_rest:
            return True
    return False


def _report(runs: dict[str, list[RunFigures]], raw_bw: float, options: argparse.Namespace) -> str:
    gb = 1e9
    every = options.every
    state = runs["ckptlib"][0].state_bytes
    nones = runs["none"]
    base_step = _mean([run.step_s for run in nones])
    lines = [
        (
            f"state size: {state / gb:.2f} GB  steps per run: {_steps(every, options.cycles)} (a warm-up "
            f"window, then {options.cycles} pairs of {every}-step windows with/without a checkpoint)  "
            f"batch: {options.batch}  host_cache_size: {options.size_gb * 1.05:.2f} GB  rounds: {options.rounds}  "
            f"THP_MEM_ALLOC_ENABLE: {'0' if options.no_thp else '1'}  allocator: {options.allocator}"
        ),
        (
            f"raw sequential write bandwidth (create+write+fsync, direct I/O, over {2 * options.rounds} samples "
            f"taken before each ckptlib run, unlink not timed): {raw_bw / 1e6:.0f} MB/s"
        ),
        "",
        (
            f"overhead = step time in windows with one checkpoint per {every} steps over windows without, "
            "in the same run (pooled over runs; per run in brackets)"
        ),
        "vs none = the run's mean step time over the no-checkpoint runs' mean",
        "",
        (
            f"{'variant':<8} {'step s':>6} {'overhead %':>10} {'(per run)':<28} {'vs none %':>9} "
            f"{'blocking s':>10} {'persist s':>9} {'persist MB/s':>12} {'peak RSS GB':>11}"
        ),
    ]
    overheads = {}
    for name in _VARIANTS:
        group = runs[name]
        pooled, per_run = _paired_overhead(group, every)
        overheads[name] = pooled
        spill = " (spills)" if any(_spills(run, every) for run in group) else ""
        step_s = _mean([r.step_s for r in group])
        lines.append(
            f"{name:<8} {step_s:>6.3f} {pooled:>+10.2f} "
            f"{'[' + ' '.join(f'{v:+.1f}' for v in per_run) + ']' + spill:<28} "
            f"{(step_s / base_step - 1) * 100:>+9.1f} "
            f"{_mean([b for r in group for b in r.blocking_s]):>10.4f} "
            f"{_mean([p for r in group for p in r.persist_s]):>9.2f} "
            f"{_mean([_throughput(r) for r in group]) / 1e6:>12.0f} {max(r.peak_rss_bytes for r in group) / gb:>11.2f}"
        )
    ck_block = _mean([b for r in runs["ckptlib"] for b in r.blocking_s])
    tr_block = _mean([b for r in runs["trainer"] for b in r.blocking_s])
    dc_block = _mean([b for r in runs["dcp"] for b in r.blocking_s])
    ck_overhead = overheads["ckptlib"]
    ck_throughput = _mean([_throughput(r) for r in runs["ckptlib"]])
    ck_rss = max(r.peak_rss_bytes for r in runs["ckptlib"])
    none_rss = max(r.peak_rss_bytes for r in nones)
    rss_bound = (state + options.size_gb * 1.05 * gb) * 1.1
    checks = [
        ("blocking >= 20x lower than Trainer sync save (x lower)", tr_block / ck_block, tr_block / ck_block >= 20),
        ("blocking lower than DCP async_save (x lower)", dc_block / ck_block, ck_block < dc_block),
        (f"step-time overhead <= 3% (one checkpoint per {every} steps, %)", ck_overhead, ck_overhead <= 3),
        ("persist throughput >= 80% of raw disk (%)", ck_throughput / raw_bw * 100, ck_throughput / raw_bw >= 0.8),
        ("peak RSS <= (state + host_cache) * 1.1 (GB)", ck_rss / gb, ck_rss <= rss_bound),
    ]
    lines += ["", "ckptlib against the targets:"]
    for label, value, ok in checks:
        lines.append(f"  {'PASS' if ok else 'FAIL'}  {label}: {value:.2f}")
    lines.append(f"  (noise floor: the same overhead figure for the no-checkpoint runs is {overheads['none']:+.2f}%)")
    lines.append(f"  (RSS bound = {rss_bound / gb:.2f} GB; ckptlib's peak RSS over the no-checkpoint run: "
                 f"{(ck_rss - none_rss) / gb:+.2f} GB)")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ckpt", description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=2.0, help="parameters + optimizer state, GB (default 2)")
    parser.add_argument("--every", type=int, default=10, help="one checkpoint per N steps (default 10)")
    parser.add_argument(
        "--cycles", type=int, default=4,
        help="pairs of N-step windows with and without a checkpoint per run, after a warm-up window (default 4)",
    )  # fmt: skip
    parser.add_argument("--batch", type=int, default=128, help="batch size (default 128)")
    parser.add_argument(
        "--rounds", type=int, default=3,
        help="rounds of (no checkpoint, ckptlib) runs (default 3)",
    )  # fmt: skip
    parser.add_argument(
        "--no-thp", action="store_true",
        help="run without THP_MEM_ALLOC_ENABLE=1 (ckptlib then copies every byte before writing it)",
    )  # fmt: skip
    parser.add_argument(
        "--allocator", default=None,
        help="glibc, or a malloc library to preload (default: jemalloc where installed, else glibc)",
    )  # fmt: skip
    parser.add_argument("--dir", default=None, help="where checkpoints are written (default: a temp dir)")
    parser.add_argument(
        "--persist-saves", type=int, default=4,
        help="saves in the persist-vs-raw section, each between two raw samples (default 4; 0 skips it)",
    )  # fmt: skip
    parser.add_argument("--persist-only", action="store_true", help="only the persist-vs-raw section (bench/ckpt/_persist.py)")
    parser.add_argument("--worker", choices=_VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    # bench.ckpt.compare: the ckptlib package of another tree (an earlier commit), and a copy mode.
    parser.add_argument("--ckptlib-from", help=argparse.SUPPRESS)
    parser.add_argument("--copy-mode", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)

    if options.worker:
        if options.ckptlib_from:
            sys.path.insert(0, options.ckptlib_from)
        figures = _worker(
            options.worker, size_gb=options.size_gb, steps=_steps(options.every, options.cycles), every=options.every,
            batch=options.batch, out=Path(options.out), copy_mode=options.copy_mode,
        )  # fmt: skip
        print(json.dumps(asdict(figures)), flush=True)
        return 0

    if options.persist_only or options.persist_saves > 0:
        from bench.ckpt._persist import measure

        persist_figures = measure(options.size_gb, max(1, options.persist_saves), Path(options.dir) if options.dir else None)
        print(persist_figures.report(), flush=True)
        if options.persist_only:
            return 0
    if options.allocator is None:
        options.allocator = ctypes.util.find_library("jemalloc") or "glibc"
    workdir = Path(tempfile.mkdtemp(prefix="bench-ckpt-", dir=options.dir))
    try:
        runs: dict[str, list[RunFigures]] = {name: [] for name in _VARIANTS}
        raw_samples: list[float] = []
        order = [("none", "ckptlib")] * options.rounds + [("trainer", "dcp")]
        for round_variants in order:
            for variant in round_variants:
                if variant == "ckptlib":
                    # Interleaved with the runs, at the size each checkpoint writes.
                    nbytes = runs["ckptlib"][-1].state_bytes if runs["ckptlib"] else int(options.size_gb * 1e9)
                    raw_samples += [raw_write_bandwidth(workdir, nbytes) for _ in range(2)]
                    print(f"raw disk bandwidth samples: {_spread(raw_samples, 1e6)} MB/s", flush=True)
                began = time.perf_counter()
                runs[variant].append(_run_variant(variant, options, workdir))
                print(f"{variant}: done in {time.perf_counter() - began:.0f}s", flush=True)
        print()
        # Bytes over seconds of all samples (each of the same size): their harmonic mean.
        raw_rate = len(raw_samples) / sum(1 / sample for sample in raw_samples)
        print(_report(runs, raw_rate, options))
        print(f"raw write+fsync samples (MB/s): {_spread(raw_samples, 1e6)}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
