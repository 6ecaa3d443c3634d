"""Fair under floods: between two flooding runs' turns the agent stores what the quiet runs
printed meanwhile, so a quiet run's line waits for one flood's turn, not for every flood's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import agent.node_agent as node_agent
import agent.output as output
from agent import runfiles
from agent.node_agent import NodeAgent
from logs.models import LogLine

pytestmark = pytest.mark.django_db


def write(directory, first: int, count: int, text: str = "line") -> int:
    with open(directory / runfiles.OUTPUT_FILE, "ab") as fh:
        for n in range(first, first + count):
            fh.write(runfiles.output_record(n, 1_764_849_600.0 + n / 1000, f"{text} {n}"))
    return first + count


def test_a_quiet_runs_line_is_stored_after_one_flood_turn_not_after_every_flood(make_job, tmp_path, monkeypatch, settings):
    settings.OUTPUT_TURN_SECONDS = 0.0  # a turn is one slice: every flood stays behind
    jobs = {name: make_job() for name in ("quiet", "flood-1", "flood-2", "flood-3")}
    parts, dirs = {}, {}
    for pk, (name, job) in enumerate(jobs.items(), start=1):
        dirs[pk] = tmp_path / name
        dirs[pk].mkdir()
        parts[pk] = SimpleNamespace(pk=pk, stream="master", ended_at=None, rank=0, runner_pid=1, attempt=SimpleNamespace(job_id=job.pk, number=1))
    monkeypatch.setattr(node_agent, "run_dir", lambda part: dirs[part.pk])
    agent = NodeAgent([], name="fairness")
    monkeypatch.setattr(agent, "runner_alive", lambda part, directory: True)
    agent.live = dict(parts)
    quiet_next = write(dirs[1], 1, 3, "quiet")
    for pk in (2, 3, 4):
        write(dirs[pk], 1, 5 * output.SLICE_LINES, "flood")

    agent.collect()
    assert agent.output.behind == {2, 3, 4}

    # In the next round, the quiet run prints while the first flood has its turn.
    order: list[str] = []
    ingest = output.ingest_lines

    def recording(*, job_id, lines, **kwargs):
        name = next(n for n, job in jobs.items() if job.pk == job_id)
        order.append(name)
        if name == "flood-1" and order.count("flood-1") == 1:
            write(dirs[1], quiet_next, 1, "quiet")
        return ingest(job_id=job_id, lines=lines, **kwargs)

    monkeypatch.setattr(output, "ingest_lines", recording)
    agent.collect()
    assert order[:3] == ["flood-1", "quiet", "flood-2"], order
    assert agent.output.behind == {2, 3, 4}
    assert list(LogLine.objects.filter(job_id=jobs["quiet"].pk).order_by("seq").values_list("text", flat=True)) == [
        "quiet 1",
        "quiet 2",
        "quiet 3",
        "quiet 4",
    ]
