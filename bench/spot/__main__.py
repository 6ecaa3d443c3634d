"""``python -m bench.spot``: the time ckptlib adds to the seed's Spot script, against the Trainer's
own synchronous save.

The seed's Spot script (``examples/spot_train.py``: the guide's HF Trainer script, offline) runs
unchanged in a fresh process per run, on a small Llama built from a config (``--hidden``,
``--layers``; the guide's Llama-3.2-1B does not fit a CPU benchmark), for ``--steps`` steps with a
save every ``--save-steps`` (4), on the CPU. Three variants of the same script and steps:

* ``none``: no save (``DecoratedCheckpointing`` a no-op, ``save_steps`` past the end);
* ``sync``: the Trainer's own synchronous save (``DecoratedCheckpointing`` a no-op);
* ``ckptlib``: the script as written (``DecoratedCheckpointing``).

``--before DIR`` adds a fourth variant: the ckptlib of another checkout (the previous commit's
worktree), run the same way, so before and after are measured in the same conditions.

``--rounds`` rounds, each running the variants in turn (the order rotates between rounds), so
drift on a shared machine falls on all three alike. The figure is ``train()``'s wall time: time
added = a variant's mean minus ``none``'s mean, and ckptlib's added time as a % of ``sync``'s
(target ≤ 10 %, aim ≤ 5 %), pooled and per round (the spread). The exit wait for the last
checkpoint (``drain``) is shown apart: it is after training. Figures less sensitive to noise
follow: the median step-end interval summed over a save cycle, each run measured against
itself (the first half of its save cycle minus the second half: whole runs of this script vary
by ±15 % on the development VM, from one process to the next, which the pooled figures cannot
tell from a save's cost), and the process CPU time of ``train()``.

Paired cycles (``--paired-rounds``, after the rounds above; ``sync``, ``ckptlib`` and ``before``
in turn, ``--paired-steps`` steps each): in one process the save cycles follow a pattern, a cycle
with a save, one without (where a save's background work may spill over), one without (the
baseline), over and over; each save's added time is its cycle minus the baseline cycle two
after it. A whole run's speed cancels out of every pair, so this is the figure that can resolve
a few milliseconds per save here; per save it measures the same cost as a save every 4 steps as
long as a save's background work ends within the next cycle (the spill cycle's excess shows it).

The profile: the interval between consecutive step ends by position in the save cycle (the
save falls in position 0's interval) for each variant, minus ``none``'s; and, per ckptlib save,
the time on the training thread inside the Trainer's save hook and its parts (planning the
checkpoint, capturing ``trainer_state.json``: the Trainer's small files are written on a writer
thread), staging at hooks, and the CPU time of ckptlib's threads. The load average
(``/proc/loadavg``) is printed before and after: this machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.stats import quantile

REPO = Path(__file__).resolve().parents[2]
VARIANTS = ("none", "sync", "ckptlib")
# Paired cycles: a save cycle, the next (where a save's background work may spill over), the one
# after (the baseline), over and over.
PAIRED_PATTERN = "SNN"


def _prepare_assets(directory: Path, hidden: int, layers: int) -> None:
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import offline_assets
    finally:
        sys.path.pop(0)
    paths = offline_assets.prepare(directory)
    from transformers import AutoConfig, LlamaForCausalLM

    config = AutoConfig.from_pretrained(paths["model"], local_files_only=True)
    config.hidden_size, config.intermediate_size, config.num_hidden_layers = hidden, hidden * 8 // 3, layers
    config.num_attention_heads = config.num_key_value_heads = max(1, hidden // 64)
    LlamaForCausalLM(config).save_pretrained(paths["model"])


def _run(variant: str, options: argparse.Namespace, workdir: Path, index: int, *, paired: bool = False) -> dict:
    import ckptlib

    run_dir = workdir / f"run-{index}-{variant}{'-paired' if paired else ''}"
    run_dir.mkdir()
    out = run_dir / "figures.json"
    # "before": the other checkout's script, runner and ckptlib, as its ckptlib variant.
    repo = Path(options.before).resolve() if variant == "before" else REPO
    vendor = str(repo / "ckptlib" / "vendor") if variant == "before" else ckptlib.vendor_path()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([vendor, str(repo)]),
        "SPOT_ASSETS_DIR": str(workdir / "assets"),
        "SPOT_OUTPUT_DIR": str(run_dir / "results"),
        "SPOT_MAX_STEPS": str(options.paired_steps if paired else options.steps),
        "SPOT_SAVE_STEPS": str(options.save_steps),
        "SPOT_MAX_LENGTH": str(options.max_length),
        "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "HF_HOME": str(workdir / "hf-home"), "TOKENIZERS_PARALLELISM": "false",
        "THP_MEM_ALLOC_ENABLE": "1",
    }  # fmt: skip
    if options.threads:
        env["OMP_NUM_THREADS"] = str(options.threads)
    if paired:
        env["BENCH_SPOT_PAIRED"] = PAIRED_PATTERN
    env.pop("CKPT_LAST_STEP", None)
    completed = subprocess.run(
        [sys.executable, "-m", "bench.spot._run", "ckptlib" if variant == "before" else variant, str(out)],
        cwd=run_dir, env=env, capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    if completed.returncode != 0:
        raise SystemExit(f"{variant} run failed:\n{completed.stderr[-4000:]}")
    shutil.rmtree(run_dir / "results", ignore_errors=True)
    return json.loads(out.read_text())


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def _fmt(values: list[float]) -> str:
    return " ".join(f"{v:.1f}" for v in values)


def _shares_of_sync(name: str, detail: str, totals: dict[str, float], saving: list[str], scale: float, unit: str, whole: str, added: str) -> list[str]:
    """One line per saving variant: what it adds to ``totals`` over none, as % of what sync adds."""
    by_sync = totals["sync"] - totals["none"]
    if by_sync <= 0:
        return [f"  {name}: sync adds nothing measurable" for _ in saving]
    lines = []
    for cv in saving:
        by_cv = totals[cv] - totals["none"]
        lines.append(
            f"  {name}{detail}: none {scale * totals['none']:{whole}} {unit}, added by sync {scale * by_sync:{added}} {unit}, "
            f"by {cv} {scale * by_cv:{added}} {unit}: {cv} {100 * by_cv / by_sync:.1f} % of sync"
        )
    return lines


def _by_position(run: dict, every: int) -> list[list[float]]:
    """Step-end intervals by position in a save cycle of ``every`` steps (0: the interval
    holding the save; a none run's positions are those its saves would have had)."""
    positions: list[list[float]] = [[] for _ in range(every)]
    # intervals[i] runs from the end of step i+1 to the end of step i+2; the save of step k
    # (k % every == 0) happens right after step k ends, so it falls in interval k-1.
    for i, interval in enumerate(run["intervals"]):
        if i + 1 >= every:  # skip the first cycle (warm-up)
            positions[(i + 1) % every].append(interval)
    return positions


def _report(runs: dict[str, list[dict]], options: argparse.Namespace, loads: list[str], elapsed: float) -> str:
    variants = list(runs)
    saving = [v for v in variants if v not in ("none", "sync")]  # ckptlib, and "before" when asked
    lines = []
    first = runs["ckptlib"][0]
    saves = options.steps // options.save_steps
    lines.append(
        f"Spot script: {options.steps} steps, a save every {options.save_steps} ({saves} saves), Llama hidden "
        f"{options.hidden} x {options.layers} layers, max_length {options.max_length}; checkpoint "
        f"{(first['bytes'] or [0])[0] / 1e6:.1f} MB (rank 0); rounds {options.rounds}; OMP_NUM_THREADS "
        f"{options.threads or 'default'}; {elapsed / 60:.1f} min"
    )
    if options.before:
        lines.append(f"before: ckptlib from {options.before}, run interleaved as one more variant")
    lines.append(f"load average (1, 5, 15 min): before {loads[0]}, after {loads[-1]}")
    lines.append("")
    lines.append("train() wall time, s (per round):")
    for variant in variants:
        values = [run["train_s"] for run in runs[variant]]
        lines.append(f"  {variant:8} mean {_mean(values):7.2f}  [{' '.join(f'{v:.2f}' for v in values)}]")
    added = {v: _mean([r["train_s"] for r in runs[v]]) - _mean([r["train_s"] for r in runs["none"]]) for v in variants}
    lines.append("")
    lines.append("time added per save: " + ", ".join(f"{v} {1000 * added[v] / saves:.1f} ms" for v in ["sync", *saving]))
    for cv in saving:
        per_round = []
        for index in range(options.rounds):
            none = runs["none"][index]["train_s"]
            sync_added = runs["sync"][index]["train_s"] - none
            ckpt_added = runs[cv][index]["train_s"] - none
            per_round.append(100 * ckpt_added / sync_added if sync_added > 0 else float("nan"))
        ratio = 100 * added[cv] / added["sync"] if added["sync"] > 0 else float("nan")
        lines.append(
            f"{cv}'s added time as % of the synchronous save's: {ratio:.1f} % pooled; per round "
            f"[{' '.join(f'{v:+.1f}' for v in per_round)}] (nan: the round's sync run was not slower than its none run; "
            f"median {quantile(per_round, 0.5):+.1f}, min {quantile(per_round, 0):+.1f}, max {quantile(per_round, 1):+.1f}); "
            "target <= 10 %, aim <= 5 %"
        )
    lines.append("")
    lines.append("robust to other processes' load (a shared machine):")
    medians = {
        v: sum(quantile([x for run in runs[v] for x in _by_position(run, options.save_steps)[p]], 0.5) for p in range(options.save_steps)) for v in variants
    }
    lines += _shares_of_sync("median step-end interval", ", summed over one save cycle", medians, saving, 1000, "ms", ".0f", "+.1f")
    lines += _within_runs(runs, saving, options.save_steps)
    cpu = {v: _mean([r["train_cpu_s"] for r in runs[v]]) for v in variants}
    lines += _shares_of_sync("process CPU time", " of train() (all threads)", cpu, saving, 1, "s", ".2f", "+.2f")
    lines.append("  per run: " + " ".join(f"{v}=[{_fmt([r['train_cpu_s'] for r in runs[v]])}]" for v in variants))
    for cv in saving:
        drains = [run.get("drain_s", 0.0) for run in runs[cv]]
        lines.append(f"{cv} exit wait for the last checkpoint (after train): mean {_mean(drains):.3f} s")
    lines += _writeback(runs, variants, saves)
    lines.append("")
    lines.append("step-end intervals by position in the save cycle, ms, minus none's (position 0 holds the save):")
    none_pos = [_mean([x for run in runs["none"] for x in _by_position(run, options.save_steps)[p]]) for p in range(options.save_steps)]
    lines.append("  none     " + " ".join(f"{1000 * v:8.1f}" for v in none_pos) + "   (absolute)")
    for variant in ("sync", *saving):
        pos = [_mean([x for run in runs[variant] for x in _by_position(run, options.save_steps)[p]]) for p in range(options.save_steps)]
        lines.append(f"  {variant:8} " + " ".join(f"{1000 * (v - n):+8.1f}" for v, n in zip(pos, none_pos, strict=True)))
    for cv in saving:
        lines.append("")
        lines.extend(_profile(runs, cv))
    return "\n".join(lines)


def _writeback(runs: dict[str, list[dict]], variants: list[str], saves: int) -> list[str]:
    """What each variant left in the page cache at the end of train(), written back by an
    ``os.sync()`` timed after the run: not in any figure above. ckptlib's files are durable
    at commit (direct I/O, fsync); the Trainer's save does not fsync."""
    if not all("writeback_s" in run for v in variants for run in runs[v]):
        return []
    parts = []
    for v in variants:
        wall = _mean([run["writeback_s"] for run in runs[v]])
        cpu = _mean([run["writeback_cpu_s"] for run in runs[v]])
        parts.append(f"{v} {wall:.2f} s ({1000 * cpu / saves:.1f} ms of CPU per save)")
    return [
        "not in the figures above: writing back what the page cache held at the end of train() "
        "(os.sync after the run; wall time, and the machine's CPU time per save): " + ", ".join(parts)
    ]


def _within_runs(runs: dict[str, list[dict]], saving: list[str], every: int) -> list[str]:
    """Each run against itself: the first half of its save cycle minus the second half (the
    median interval at each position), so a run that is slower as a whole (this VM's runs vary
    by +-15 %) cancels out. It leaves out what a save costs the cycle's later steps."""
    if every < 2 or every % 2:
        return []
    half = every // 2

    def added(run: dict) -> float:
        medians = [quantile(values, 0.5) for values in _by_position(run, every)]
        return sum(medians[:half]) - sum(medians[half:])

    figures = {v: [1000 * added(run) for run in runs[v]] for v in ("sync", *saving)}
    lines = [
        f"  within each run, positions 0-{half - 1} minus {half}-{every - 1} of the save cycle (median per position), ms: "
        + " ".join(f"{v} {_mean(f):+.1f} [{_fmt(f)}]" for v, f in figures.items())
    ]
    by_sync = _mean(figures["sync"])
    for cv in saving:
        share = 100 * _mean(figures[cv]) / by_sync if by_sync > 0 else float("nan")
        lines.append(f"    {cv}: {share:.1f} % of sync by this figure")
    return lines


def _paired(paired: dict[str, list[dict]], every: int) -> list[str]:
    """Paired cycles: in one process, save cycles (the ``every`` steps from a saving step's end,
    the save included) against the no-save cycle two after them, the cycle between left to any
    background work a save spills over (its excess over the baseline is printed as well). Whole
    runs' variation (+-15 % here) cancels out; what is left is cycle-to-cycle jitter."""
    period = len(PAIRED_PATTERN)

    def cycles(run: dict) -> list[tuple[float, float]]:
        intervals = run["intervals"]

        def duration(step: int) -> float:  # end of step ``step`` to end of step ``step + every``
            return sum(intervals[step - 1 : step - 1 + every])

        pairs = []
        # Skip the first period (warm-up); each save cycle needs the two after it.
        for cycle in range(period, len(intervals) // every):
            step = cycle * every
            if PAIRED_PATTERN[cycle % period] == "S" and step - 1 + 3 * every <= len(intervals):
                base = duration(step + 2 * every)
                pairs.append((duration(step) - base, duration(step + every) - base))
        return pairs

    lines = [
        f"paired cycles, in one process ({PAIRED_PATTERN}: a cycle of {every} steps with a save, the next (spill), "
        "the one after (baseline)), ms per save over the baseline: the save's cycle, and the save's and the next "
        "together (any background work that spilled over included; this VM's occasional slow cycle falls in "
        "means, rarely in medians):"
    ]
    figures: dict[str, dict[str, list[float]]] = {}
    for variant, variant_runs in paired.items():
        by_run = [cycles(run) for run in variant_runs]
        pairs = [pair for run_pairs in by_run for pair in run_pairs]
        if len(pairs) < 2:
            lines.append(f"  {variant:8} too few save cycles ({len(pairs)})")
            continue
        figures[variant] = {"save cycle": [1000 * a for a, _ in pairs], "with the next": [1000 * (a + b) for a, b in pairs]}
        per_run = [statistics.fmean([1000 * a for a, _ in run_pairs] or [float("nan")]) for run_pairs in by_run]
        for name, values in figures[variant].items():
            mean, se = statistics.fmean(values), statistics.stdev(values) / len(values) ** 0.5
            lines.append(
                f"  {variant:8} {name:13} mean {mean:+7.1f} (se {se:4.1f}, n {len(values)})  median {quantile(values, 0.5):+7.1f}  "
                f"quartiles {quantile(values, 0.25):+.1f} / {quantile(values, 0.75):+.1f}"
                + (f"  per run (means) [{_fmt(per_run)}]" if name == "save cycle" else "")
            )
    if "sync" in figures:
        for variant in figures:
            if variant == "sync":
                continue
            for name, values in figures[variant].items():
                sync = figures["sync"][name]
                mean, sync_mean = statistics.fmean(values), statistics.fmean(sync)
                if sync_mean <= 0:
                    continue
                se = statistics.stdev(values) / len(values) ** 0.5
                sync_se = statistics.stdev(sync) / len(sync) ** 0.5
                ratio = mean / sync_mean
                # The ratio's standard error by the delta method (the two means are independent).
                ratio_se = ((se / sync_mean) ** 2 + (ratio * sync_se / sync_mean) ** 2) ** 0.5
                sync_median = quantile(sync, 0.5)
                by_medians = f"{100 * quantile(values, 0.5) / sync_median:.1f} %" if sync_median > 0 else "undefined (sync's median <= 0)"
                lines.append(
                    f"  {variant} as % of sync, {name}: {100 * ratio:.1f} % by means (se {100 * ratio_se:.1f}; about 95 %: "
                    f"{100 * (ratio - 2 * ratio_se):.1f} to {100 * (ratio + 2 * ratio_se):.1f} %), "
                    f"{by_medians} by medians; target <= 10 %, aim <= 5 %"
                )
    return lines


def _profile(runs: dict[str, list[dict]], variant: str) -> list[str]:
    lines = [f"per {variant} save, ms on the training thread (mean over runs):"]

    def per_save(label: str) -> float:
        return _mean([1000 * run["times"].get(label, 0.0) / max(1, run["counts"].get("save_checkpoint", 1)) for run in runs[variant]])

    lines.append(f"  the Trainer's save hook (DecoratedCheckpointing._save_checkpoint) {per_save('save_checkpoint'):7.2f}")
    lines.append(f"    engine.save                                                   {per_save('engine_save'):7.2f}")
    lines.append(f"      planning (plan_state)                                       {per_save('plan'):7.2f}")
    lines.append(f"    the Trainer's small files, or (now) its state json captured   {per_save('small_files'):7.2f}")
    lines.append(f"  staging at hooks (forward/backward/pre-step)                    {per_save('hooks'):7.2f}")
    blocking = _mean([1000 * _mean(run["blocking_s"]) for run in runs[variant]])
    lines.append(f"  blocking_s reported by ckptlib (save + hooks)                   {blocking:7.2f}")
    cpu = _mean([1000 * run["ckptlib_thread_cpu_s"] / max(1, len(run["bytes"])) for run in runs[variant]])
    lines.append(f"  CPU of ckptlib's threads (writers, commit), per save            {cpu:7.2f}")
    label = "trainer_save_checkpoint"
    sync_save = _mean([1000 * run["times"].get(label, 0.0) / max(1, run["counts"].get(label, 1)) for run in runs["sync"]])
    lines.append(f"  (sync: Trainer._save_checkpoint per save                        {sync_save:7.2f})")
    return lines


def _print_report(runs: dict[str, list[dict]], paired: dict[str, list[dict]], options: argparse.Namespace, loads: list[str], elapsed: float) -> None:
    print(_report(runs, options, loads, elapsed))
    if any(paired.values()):
        print()
        print("\n".join(_paired(paired, options.save_steps)))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.spot", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--save-steps", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="OMP_NUM_THREADS for the runs (default: torch's, all cores)")
    parser.add_argument(
        "--before", default=None, metavar="DIR",
        help="also run the ckptlib of another checkout (DIR: its repository root, e.g. a git worktree of the "
        "previous commit) as a fourth variant, interleaved: before/after in the same conditions",
    )  # fmt: skip
    parser.add_argument(
        "--paired-rounds", type=int, default=2,
        help="rounds of paired-cycle runs (sync, ckptlib[, before]), after the rounds above; 0: none",
    )  # fmt: skip
    parser.add_argument("--paired-steps", type=int, default=156, help="steps of each paired-cycle run")
    parser.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    parser.add_argument("--json", default=None, help="also write every run's figures here")
    parser.add_argument("--report", default=None, metavar="JSON", help="print the report of an earlier --json file; run nothing")
    options = parser.parse_args()
    if options.report:
        saved = json.loads(Path(options.report).read_text())
        for key, value in saved.get("options", {}).items():
            if key not in ("report", "json", "dir"):
                setattr(options, key, value)
        _print_report(saved["runs"], saved.get("paired", {}), options, saved.get("loads", ["?"]), saved.get("elapsed_s", 0.0))
        return
    workdir = Path(options.dir or tempfile.mkdtemp(prefix="bench-spot-"))
    workdir.mkdir(parents=True, exist_ok=True)
    _prepare_assets(workdir / "assets", options.hidden, options.layers)
    variants = VARIANTS + (("before",) if options.before else ())
    runs: dict[str, list[dict]] = {variant: [] for variant in variants}
    loads = [_loadavg()]
    began = time.perf_counter()
    for index in range(options.rounds):
        order = variants[index % len(variants) :] + variants[: index % len(variants)]
        for variant in order:
            runs[variant].append(_run(variant, options, workdir, index))
            print(f"round {index + 1} {variant}: train {runs[variant][-1]['train_s']:.2f} s  (load {_loadavg()})", flush=True)
        loads.append(_loadavg())
    paired: dict[str, list[dict]] = {variant: [] for variant in variants if variant != "none"}
    for index in range(options.paired_rounds):
        names = list(paired)
        for variant in names[index % len(names) :] + names[: index % len(names)]:
            paired[variant].append(_run(variant, options, workdir, index, paired=True))
            print(f"paired round {index + 1} {variant}: train {paired[variant][-1]['train_s']:.2f} s  (load {_loadavg()})", flush=True)
        loads.append(_loadavg())
    if options.json:  # before the report: the runs are kept whatever happens to it
        saved = {"options": vars(options), "loads": loads, "elapsed_s": time.perf_counter() - began, "runs": runs, "paired": paired}
        Path(options.json).write_text(json.dumps(saved))
    print()
    _print_report(runs, paired, options, loads, time.perf_counter() - began)
    if not options.dir:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
