"""The web processes' shared PROMETHEUS_MULTIPROC_DIR: each Daphne, starting, removes the files of
web processes that no longer run and keeps those of its running siblings."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from console.asgi import tidy_metrics_dir


@pytest.mark.slow  # a Python process of its own
def test_a_starting_web_process_removes_only_dead_processes_files(tmp_path, monkeypatch):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    dead_pid = int(dead.stdout)
    metrics = tmp_path / "metrics"
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(metrics))
    tidy_metrics_dir()  # made when missing
    assert metrics.is_dir()
    names = [f"counter_{dead_pid}.db", f"gauge_livesum_{dead_pid}.db", f"histogram_{os.getppid()}.db", f"counter_{os.getpid()}.db", "notes.txt"]
    for name in names:
        (metrics / name).write_bytes(b"")
    tidy_metrics_dir()
    assert sorted(p.name for p in metrics.iterdir()) == sorted(names[2:])


def test_nothing_happens_without_the_setting(monkeypatch):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    tidy_metrics_dir()
