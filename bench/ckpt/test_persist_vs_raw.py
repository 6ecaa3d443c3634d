"""``python -m bench.ckpt --persist-only``, small: persist, timed from the ``save`` call to the
commit's fsync over the bytes written, never beats the raw create+write+fsync of the same bytes
on the same disk by more than the raw samples' own spread."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # trains and writes ~1 GB
def test_persist_is_not_faster_than_the_raw_disk(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "bench.ckpt", "--persist-only", "--size-gb", "0.1", "--persist-saves", "3",
         "--dir", str(tmp_path)],
        capture_output=True, text=True, cwd=_ROOT, env={**os.environ, "PYTHONPATH": str(_ROOT)}, timeout=300,
        check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    match = re.search(r"ratio persist/raw (\d+) % \(raw spread (\d+) %\)", completed.stdout)
    assert match, completed.stdout
    ratio, spread = int(match[1]), int(match[2])
    assert ratio <= 100 + spread, completed.stdout
    assert re.search(r"persist \d+ MB/s \(min \d+, max \d+ \[", completed.stdout), completed.stdout
    assert not list(tmp_path.iterdir())  # the bench leaves nothing behind
