"""The runner's own output file stops growing at the job's log cap, in lines and in bytes, and keeps
the run's end: its first lines, then (written when the run ends) one marker saying how many lines
were dropped and the run's last lines; progress and checkpoint lines pushed out of the tail before
that are written as they go, and a line held long enough is written on time. Unit tests of
``OutputCap`` on a file, and the real ``python -m agent.runner`` on a spec, on the host."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from agent import runfiles
from agent.output_cap import TAIL_HOLD_SECONDS, OutputCap
from agent.runfiles import OutputWriter, RunSpec

REPO = Path(__file__).resolve().parents[2]
COMMIT = "[Concurrent Checkpoint] committed step=10 bytes=1 blocking_s=0.1 persist_s=0.2 path=/out/x"


def run(tmp_path: Path, program: str, **limits: int) -> list[dict]:
    """Run ``python -c program`` under the runner with the caps given; its output records."""
    (tmp_path / "work").mkdir()
    command = f"{sys.executable} -c {shlex.quote(program)}"
    spec = RunSpec(command=command, cwd=str(tmp_path / "work"), env={"PATH": os.environ["PATH"]}, **limits)
    spec_path = runfiles.write_spec(tmp_path, spec)
    subprocess.run(
        [sys.executable, "-m", "agent.runner", str(spec_path)], cwd=REPO, check=True, timeout=300, env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO)}
    )
    ended = runfiles.read_exit(tmp_path)
    assert ended is not None and ended.exit_code == 0
    return records_of(tmp_path)


def records_of(directory: Path) -> list[dict]:
    return [json.loads(raw) for raw in (directory / runfiles.OUTPUT_FILE).read_bytes().splitlines()]


def capped(tmp_path: Path, lines: list[tuple[str, float]], *, max_lines: int = 0, max_bytes: int = 0, tail: int = 10_000, preamble: int = 0):
    """Feed ``lines`` (text, time) through an ``OutputCap`` after ``preamble`` platform lines; the
    cap and the file's records."""
    with OutputWriter(tmp_path) as out:
        for i in range(preamble):
            out.emit(f"[console] preamble {i}", 0.0)
        cap = OutputCap(out, max_lines, max_bytes, tail)
        for text, now in lines:
            cap.take(text, now)
        cap.finish(lines[-1][1] if lines else 0.0)
    return cap, records_of(tmp_path)


def test_past_the_line_cap_the_file_keeps_its_head_a_marker_with_the_count_and_its_tail(tmp_path):
    printed = [f"line {i}" if i % 50 else f"step {i} loss 0.5" for i in range(1, 1001)]
    cap, records = capped(tmp_path, [(text, 100.0) for text in printed], max_lines=100, tail=30, preamble=3)
    numbers, texts = [r["n"] for r in records], [r["s"] for r in records]
    # The platform's three lines are not counted: the head is the command's first 100 lines.
    assert texts[:4] == ["[console] preamble 0", "[console] preamble 1", "[console] preamble 2", "line 1"]
    assert texts[3:103] == printed[:100] and numbers[:103] == list(range(1, 104))
    # Pushed out of the tail: the progress lines are written as they go, the others dropped.
    progress = [i for i in range(101, 971) if i % 50 == 0]
    assert texts[103 : 103 + len(progress)] == [f"step {i} loss 0.5" for i in progress]
    assert numbers[103 : 103 + len(progress)] == [3 + i for i in progress]
    marker = records[103 + len(progress)]
    # Between the last line written (step 950) and the tail (line 971 on): 20 lines, 870 - 17 in all.
    assert marker["s"].startswith("[log cap] 20 lines of this run dropped here, 853 in all (past the log cap of 100 lines, LOG_MAX_LINES_PER_JOB")
    assert marker["s"].endswith("the last 30 follow") and marker["n"] == 3 + 950 + 1
    assert texts[-30:] == printed[-30:] and numbers[-30:] == list(range(3 + 971, 3 + 1001))
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers), "numbers in order: the agent counts each line once"
    assert len(records) == 3 + 100 + len(progress) + 1 + 30 and cap.dropped == 853


def test_a_line_held_long_enough_is_written_on_time_while_the_budget_lasts(tmp_path):
    with OutputWriter(tmp_path) as out:
        cap = OutputCap(out, 10, 0, 1000)
        for i in range(10):
            cap.take(f"head {i}", 0.0)
        assert cap.flush(now=50.0) is None  # nothing held: the runner may wait as long as it likes
        cap.take("slow 1", 100.0)
        assert cap.flush(now=105.0) == 100.0 + TAIL_HOLD_SECONDS - 105.0  # then call again
        assert cap.flush(now=100.0 + TAIL_HOLD_SECONDS) is None  # "slow 1" waited its time: written
        out.flush()
        assert records_of(tmp_path)[-1]["s"] == "slow 1"
        # Up to one and a half times the cap: 4 more lines, then held lines stay in the tail.
        for i in range(2, 12):
            cap.take(f"slow {i}", 100.0 + i * TAIL_HOLD_SECONDS)
        out.flush()
        assert not cap.aging and len(records_of(tmp_path)) == 15
        cap.finish(300.0)
    assert [r["s"] for r in records_of(tmp_path)][10:] == [f"slow {i}" for i in range(1, 12)]
    assert cap.dropped == 0


def test_past_the_byte_cap_lines_are_held_too_and_progress_lines_stop_at_twice_the_cap(tmp_path):
    cap, records = capped(tmp_path, [("a" * 100, 0.0), ("b" * 100, 0.0), ("step 1", 0.0), ("c", 0.0), ("step 2", 0.0)], max_bytes=200, tail=1)
    texts = [r["s"] for r in records]
    assert cap.reached == "the output cap of 200 bytes"
    assert texts[:2] == ["a" * 100, "step 1"] and texts[3:] == ["step 2"]
    assert texts[2].startswith("[log cap] 1 line of this run dropped here, 2 in all (past the output cap of 200 bytes, LOG_MAX_BYTES_PER_JOB")
    (tmp_path / "lines").mkdir()
    cap, records = capped(tmp_path / "lines", [(text, 0.0) for text in ("a", "b", "c", "step 1", "step 2", "step 3", "d")], max_lines=2, tail=0)
    assert [r["s"] for r in records[:4]] == ["a", "b", "step 1", "step 2"]  # up to twice the cap
    assert records[4]["s"].startswith("[log cap] 2 lines of this run dropped here, 3 in all") and records[4]["s"].endswith("the last 0 follow")
    assert len(records) == 5


@pytest.mark.slow  # a runner process
def test_the_runner_keeps_the_head_progress_lines_and_the_end_of_a_run_past_its_line_cap(tmp_path):
    program = (
        f"for i in range(3000):\n    print('line', i)\n    if i % 500 == 499: print(f'step {{i}} loss 0.5')\nprint({COMMIT!r})\nraise ValueError('the end')\n"
    )
    printed = [text for i in range(3000) for text in [f"line {i}", f"step {i} loss 0.5"][: 1 + (i % 500 == 499)]] + [COMMIT]
    (tmp_path / "work").mkdir()
    spec = RunSpec(
        command=f"{sys.executable} -c {shlex.quote(program)}",
        cwd=str(tmp_path / "work"),
        env={"PATH": os.environ["PATH"], "PYTHONUNBUFFERED": "1"},  # as a job's environment has it: the traceback comes last
        max_lines=1000,
        tail_lines=100,
    )
    runner = [sys.executable, "-m", "agent.runner", str(runfiles.write_spec(tmp_path, spec))]
    subprocess.run(runner, cwd=REPO, check=True, timeout=300, env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO)})
    records = records_of(tmp_path)
    texts = [r["s"] for r in records]
    assert texts[:1000] == printed[:1000]
    marker = next(i for i, t in enumerate(texts) if t.startswith("[log cap]"))
    # Pushed out of the tail, the progress lines were written as they went; the tail is the run's
    # last 100 lines: the last step, the commit line and the traceback among them.
    assert texts[1000:marker] == [t for t in printed[1000:-97] if t.startswith("step ")] == [f"step {i} loss 0.5" for i in (999, 1499, 1999, 2499)]
    assert " lines of this run dropped here" in texts[marker] and texts[marker].endswith("the last 100 follow")
    assert texts[marker + 1 : -3] == printed[-97:]
    assert texts[-3] == "Traceback (most recent call last):" and texts[-1] == "ValueError: the end"
    numbers = [r["n"] for r in records]
    ended = runfiles.read_exit(tmp_path)
    assert ended is not None and ended.exit_code == 1
    assert numbers == sorted(numbers) and numbers[-1] == ended.lines == len(printed) + 3


@pytest.mark.slow  # a runner process
def test_a_flood_of_long_lines_and_one_endless_line_stay_within_the_byte_caps(tmp_path):
    cap = 1 << 20
    program = (
        "import sys\n"
        "for i in range(3000): sys.stdout.write(f'{i:05} ' + 'é' * 8000 + '\\n')\n"  # 3000 × 16 KB
        "sys.stdout.write('step 7 loss 0.25\\n')\n"
        "sys.stdout.write('x' * (256 << 20))\n"  # 256 MiB without a newline
        "sys.stdout.write('\\nafter\\n')\n"
    )
    records = run(tmp_path, program, max_lines=200_000, max_bytes=cap)
    size = (tmp_path / runfiles.OUTPUT_FILE).stat().st_size
    # The head within the cap, then the marker and a tail of at most the cap's characters (é: 2 bytes).
    assert size <= cap + 2 * cap + (64 << 10)
    texts = [r["s"] for r in records]
    marker = next(i for i, t in enumerate(texts) if t.startswith("[log cap]"))
    assert "(past the output cap of 1 MiB, LOG_MAX_BYTES_PER_JOB" in texts[marker]
    assert sum(len(raw) + 1 for raw in (tmp_path / runfiles.OUTPUT_FILE).read_bytes().splitlines()[:marker]) <= cap
    assert [t[:5] for t in texts[:marker]] == [f"{i:05}" for i in range(marker)]
    # The run's end: its last long lines, the progress line, the endless line cut, the last line.
    assert texts[-3] == "step 7 loss 0.25" and texts[-2].startswith("x" * 100) and texts[-1] == "after"
    assert texts[-4][:5] == "02999"
    assert records[-1]["n"] == 3000 + 3
