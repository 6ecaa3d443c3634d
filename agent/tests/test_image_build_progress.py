"""A first build of the default image says it is alive: each step's name, its seconds so far and
the build's, every PROGRESS_EVERY seconds, until the build ends (then nothing more)."""

from __future__ import annotations

import threading

import pytest

from agent.engine import build

pytestmark = pytest.mark.slow  # a thread that beats


def test_each_step_says_its_seconds_until_the_build_stops(monkeypatch):
    monkeypatch.setattr(build, "PROGRESS_EVERY", 0.05)
    lines: list[str] = []
    heard = threading.Event()

    def log(line: str) -> None:
        lines.append(line)
        if line.startswith("[image] import (3 of 5): "):
            heard.set()

    progress = build._Progress(log, step="pip (2 of 5)")
    while len(lines) < 2:
        assert progress.thread.is_alive()
        threading.Event().wait(0.01)
    progress.at("import (3 of 5)")
    assert heard.wait(10)
    progress.stop()
    said = len(lines)
    assert all(line.startswith("[image] pip (2 of 5): ") and line.endswith(" s in all)") for line in lines[:2])
    assert not progress.thread.is_alive() and len(lines) == said
