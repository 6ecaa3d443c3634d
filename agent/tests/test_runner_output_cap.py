"""The runner's own output file stops growing at the job's log cap, in lines and in bytes, with a
marker line where it stops: the real ``python -m agent.runner`` on a spec, on the host."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from agent import runfiles
from agent.runfiles import RunSpec
from agent.runner import OutputCap

REPO = Path(__file__).resolve().parents[2]


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
    records = [json.loads(raw) for raw in (tmp_path / runfiles.OUTPUT_FILE).read_bytes().splitlines()]
    assert ended.lines == records[-1]["n"]
    return records


@pytest.mark.slow  # a runner process
def test_past_the_line_cap_the_file_keeps_a_marker_progress_lines_and_a_count(tmp_path):
    program = (
        "for i in range(3000):\n"
        "    print('line', i)\n"
        "    if i % 500 == 499: print(f'step {i} loss 0.5')\n"
        "print('[Concurrent Checkpoint] committed step=10 bytes=1 blocking_s=0.1 persist_s=0.2 path=/out/x')\n"
        "print('the end')\n"
    )
    records = run(tmp_path, program, max_lines=1000)
    texts = [r["s"] for r in records]
    numbers = [r["n"] for r in records]
    assert texts[:2] == ["line 0", "line 1"]
    assert texts[1000] == (
        "[console] this run's output reached the log cap of 1,000 lines (LOG_MAX_LINES_PER_JOB): later lines are "
        "counted by their line numbers, not kept (progress and checkpoint lines still are, up to twice the cap); "
        "the run goes on"
    )
    # The marker takes the place (and the number) of the first line left out: numbers still count lines.
    assert numbers[999:1001] == [1000, 1001]
    kept_after = texts[1001:-1]
    assert kept_after == [f"step {i} loss 0.5" for i in (999, 1499, 1999, 2499, 2999)] + [
        "[Concurrent Checkpoint] committed step=10 bytes=1 blocking_s=0.1 persist_s=0.2 path=/out/x"
    ]
    printed = 3000 + 6 + 2
    assert records[-1] == {
        "n": printed,
        "t": records[-1]["t"],
        "s": f"[console] {printed - 1000 - 6:,} lines of this run past the log cap of 1,000 were counted, not kept",
    }
    assert len(records) == 1000 + 1 + 6 + 1


@pytest.mark.slow  # a runner process
def test_a_flood_of_long_lines_and_one_endless_line_stop_at_the_byte_cap(tmp_path):
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
    assert size <= cap + 1024  # the ordinary lines within the cap, then the marker and the count
    texts = [r["s"] for r in records]
    marker = next(i for i, t in enumerate(texts) if t.startswith("[console] this run's output reached"))
    assert texts[marker].startswith("[console] this run's output reached the output cap of 1 MiB (LOG_MAX_BYTES_PER_JOB)")
    assert sum(len(raw) + 1 for raw in (tmp_path / runfiles.OUTPUT_FILE).read_bytes().splitlines()[:marker]) <= cap
    assert [t[:5] for t in texts[:marker]] == [f"{i:05}" for i in range(marker)]
    assert texts[marker + 1 :] == ["step 7 loss 0.25", f"[console] {3000 - marker + 2:,} lines of this run past the output cap of 1 MiB were counted, not kept"]
    assert records[marker]["n"] == marker + 1 and records[-1]["n"] == 3000 + 3


def test_progress_lines_past_the_cap_stop_at_twice_it():
    cap = OutputCap(max_lines=0, max_bytes=1000)
    assert cap.keeps("a" * 10, 600, 0)
    assert not cap.keeps("b", 600, 600) and cap.reached == "the output cap of 1,000 bytes"
    assert not cap.keeps("small", 10, 600)  # past the cap ordinary lines stay out, whatever their size
    assert cap.keeps("step 1", 600, 600)
    assert not cap.keeps("step 2", 900, 1200)
    lines = OutputCap(max_lines=2, max_bytes=0)
    assert [lines.keeps(t, 1, 0) for t in ("a", "b", "c", "step 1", "step 2", "step 3")] == [True, True, False, True, True, False]
