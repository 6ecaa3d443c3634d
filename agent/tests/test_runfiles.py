"""The run-file contract (``agent.runfiles``): what the runner writes is what the agent reads, and
whatever else a job-controlled process could have left in a run directory comes back typed, in
range, or not at all — never a crash, a hang or a link followed."""

from __future__ import annotations

import json
import os

import pytest

from agent import runfiles
from agent.runfiles import ExitRecord, PidRecord, RunSpec


def test_what_the_runner_writes_the_agent_reads_back(tmp_path):
    spec_path = runfiles.write_spec(tmp_path, RunSpec(command="echo hi", cwd="/w", env={"A": "1"}, max_lines=10, preamble=["first"]))
    assert oct(os.stat(spec_path).st_mode & 0o777) == "0o600"  # the job's environment: the agent's eyes only
    assert runfiles.read_spec(spec_path) == RunSpec(command="echo hi", cwd="/w", env={"A": "1"}, max_lines=10, preamble=["first"])

    assert runfiles.read_pid(tmp_path) is None and not runfiles.pid_written(tmp_path)
    runfiles.write_pid(tmp_path, PidRecord(runner_pid=10, pgid=11, started_at=5.0, cgroup=("/sys/fs/cgroup/x",), container="c"))
    assert runfiles.read_pid(tmp_path) == PidRecord(runner_pid=10, pgid=11, started_at=5.0, cgroup=("/sys/fs/cgroup/x",), container="c")

    with runfiles.OutputWriter(tmp_path) as out:
        out.emit("one", 1.0)
        out.skip()
        out.emit("three ✓", 3.0)
        out.note("a note", 4.0)
    chunk = runfiles.read_output(tmp_path, 0)
    assert [(line.number, line.text) for line in chunk.lines] == [(1, "one"), (3, "three ✓"), (3, "a note")]
    assert chunk.at_end and chunk.unreadable == 0
    assert runfiles.read_output(tmp_path, chunk.offset).lines == []

    assert runfiles.read_exit(tmp_path) is None
    runfiles.write_exit(tmp_path, ExitRecord(exit_code=None, signal=9, ended_at=6.0, lines=3, oom_kills=1, memory_limit_mb=128))
    ended = runfiles.read_exit(tmp_path)
    assert ended == ExitRecord(exit_code=None, signal=9, ended_at=6.0, lines=3, oom_kills=1, memory_limit_mb=128)
    assert ended.readable and ended.out_of_memory
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([runfiles.SPEC_FILE, runfiles.PID_FILE, runfiles.OUTPUT_FILE, runfiles.EXIT_FILE])


def test_a_pid_record_without_a_process_group_says_there_is_nothing_to_signal(tmp_path):
    runfiles.write_pid(tmp_path, PidRecord(runner_pid=2**23, pgid=None))
    assert "pgid" not in json.loads((tmp_path / runfiles.PID_FILE).read_text())
    assert runfiles.read_pid(tmp_path).pgid is None


@pytest.mark.parametrize(
    "payload, expected",
    [
        (
            {"runner_pid": True, "pgid": 2**40, "started_at": float("inf"), "cgroup": ["/ok", 7, None], "container_pid": 1},
            PidRecord(runner_pid=None, pgid=None, started_at=0.0, cgroup=("/ok",)),
        ),
        ({"runner_pid": "12", "pgid": -5, "cgroup": "/not-a-list", "container": ["x"]}, PidRecord(runner_pid=None, pgid=None)),
        # The node Slurm ran it on: a node's name, nothing else (a path, a newline, a list).
        ({"runner_pid": 12, "node": "node-b"}, PidRecord(runner_pid=12, pgid=None, node="node-b")),
        ({"runner_pid": 12, "node": "../../etc"}, PidRecord(runner_pid=12, pgid=None)),
        ({"runner_pid": 12, "node": "a\nb"}, PidRecord(runner_pid=12, pgid=None)),
        ({"runner_pid": 12, "node": ["node-b"]}, PidRecord(runner_pid=12, pgid=None)),
    ],
)
def test_a_forged_pid_record_yields_no_field_out_of_range(tmp_path, payload, expected):
    (tmp_path / runfiles.PID_FILE).write_text(json.dumps(payload))
    assert runfiles.read_pid(tmp_path) == expected


def test_an_exit_record_that_cannot_be_read_is_an_end_of_unknown_status(tmp_path):
    (tmp_path / runfiles.EXIT_FILE).write_text("not json")
    ended = runfiles.read_exit(tmp_path)
    assert ended is not None and not ended.readable  # the agent reports it ended, cause unknown
    (tmp_path / runfiles.EXIT_FILE).write_text(json.dumps({"exit_code": 2**40, "signal": 0, "oom_kills": True, "pids_limit_hit": 1.5}))
    assert runfiles.read_exit(tmp_path) == ExitRecord(exit_code=None, signal=None)


def test_run_files_are_never_read_through_a_link_or_a_fifo(tmp_path):
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"runner_pid": 1234, "pgid": 1234}))
    run = tmp_path / "run"
    run.mkdir()
    os.symlink(secret, run / runfiles.PID_FILE)
    os.symlink(secret, run / runfiles.EXIT_FILE)
    os.mkfifo(run / runfiles.OUTPUT_FILE)  # opening it to read would block for good
    assert runfiles.read_pid(run) is None
    assert runfiles.read_exit(run) == ExitRecord(exit_code=None, signal=None)
    assert runfiles.read_output(run, 0) == runfiles.OutputChunk([], 0, 0, True)


def test_a_record_file_past_its_limit_is_refused(tmp_path):
    (tmp_path / runfiles.PID_FILE).write_text(json.dumps({"runner_pid": 5, "pad": "x" * runfiles.RECORD_MAX_BYTES}))
    assert runfiles.read_pid(tmp_path) is None
    with pytest.raises(runfiles.Refused):
        runfiles.read_bounded(tmp_path / runfiles.PID_FILE, runfiles.RECORD_MAX_BYTES)


def test_a_last_line_without_its_newline_waits_unless_the_output_is_complete(tmp_path):
    (tmp_path / runfiles.OUTPUT_FILE).write_bytes(runfiles.output_record(1, 1.0, "whole") + b'{"n": 2, "t": 2.0, "s": "half')
    first = runfiles.read_output(tmp_path, 0)
    assert [line.text for line in first.lines] == ["whole"] and not first.at_end
    assert runfiles.read_output(tmp_path, first.offset).lines == []
    (tmp_path / runfiles.OUTPUT_FILE).open("ab").write(b'"}')
    last = runfiles.read_output(tmp_path, first.offset, complete=True)  # the exit record is written
    assert [line.text for line in last.lines] == ["half"] and last.at_end
    assert last.offset == (tmp_path / runfiles.OUTPUT_FILE).stat().st_size


def test_one_line_longer_than_a_read_is_skipped_and_the_next_is_read(tmp_path):
    (tmp_path / runfiles.OUTPUT_FILE).write_bytes(b"x" * 5000 + b"\n" + runfiles.output_record(1, 1.0, "after"))
    texts, unreadable, offset = [], 0, 0
    for _ in range(10):
        chunk = runfiles.read_output(tmp_path, offset, max_bytes=2000)
        texts += [line.text for line in chunk.lines]
        unreadable += chunk.unreadable
        offset = chunk.offset
        if chunk.at_end:
            break
    assert texts == ["after"] and unreadable >= 1


def test_a_read_takes_at_most_max_lines_records_and_the_next_read_goes_on_from_there(tmp_path):
    path = tmp_path / runfiles.OUTPUT_FILE
    path.write_bytes(b"".join(runfiles.output_record(n, float(n), f"l{n}") for n in range(1, 8)))
    texts, offset, reads = [], 0, 0
    while True:
        chunk = runfiles.read_output(tmp_path, offset, max_lines=3)
        reads += 1
        texts += [line.text for line in chunk.lines]
        offset = chunk.offset
        if chunk.at_end:
            break
    assert texts == [f"l{n}" for n in range(1, 8)] and reads == 3 and offset == path.stat().st_size
    assert runfiles.output_size(tmp_path) == offset and runfiles.output_size(tmp_path / "none") == 0


def test_the_output_size_of_a_link_is_none(tmp_path):
    (tmp_path / "elsewhere").write_bytes(b"x" * 100)
    (tmp_path / runfiles.OUTPUT_FILE).symlink_to(tmp_path / "elsewhere")
    assert runfiles.output_size(tmp_path) == 0


@pytest.mark.parametrize(
    "record",
    [{"n": 1, "t": 1.0, "s": "x" * (runfiles.OUTPUT_TEXT_MAX_CHARS + 1)}, {"n": 2**62, "t": 1.0, "s": "x"}, {"n": 1, "t": -1, "s": "x"}],
)
def test_an_output_record_out_of_range_is_counted_and_skipped(tmp_path, record):
    (tmp_path / runfiles.OUTPUT_FILE).write_bytes(json.dumps(record).encode() + b"\n" + runfiles.output_record(2, 2.0, "ok"))
    chunk = runfiles.read_output(tmp_path, 0, max_bytes=4 << 20)
    assert [line.text for line in chunk.lines] == ["ok"] and chunk.unreadable == 1


def test_a_spec_that_is_not_one_is_refused(tmp_path):
    path = tmp_path / runfiles.SPEC_FILE
    for bad in ("[]", json.dumps({"command": "x", "cwd": "/", "env": {"A": 1}}), json.dumps({"cwd": "/", "env": {}}), "{"):
        path.write_text(bad)
        with pytest.raises(runfiles.SpecRefused):
            runfiles.read_spec(path)
    assert runfiles.spec_container(tmp_path) is None


def test_stale_files_of_an_earlier_run_are_cleared_and_unfinished_runs_found(tmp_path):
    run = tmp_path.joinpath(*runfiles.run_dir_parts(7, 2, 0))
    run.mkdir(parents=True)
    runfiles.write_pid(run, PidRecord(runner_pid=1, pgid=1))
    assert list(runfiles.unfinished_run_dirs(tmp_path)) == [run]
    runfiles.write_exit(run, ExitRecord(exit_code=0, signal=None))
    assert list(runfiles.unfinished_run_dirs(tmp_path)) == []
    runfiles.write_env(run, "A=1\n")
    runfiles.clear_stale(run)
    assert list(run.iterdir()) == []


@pytest.mark.parametrize("text", ["plain", 'a "quoted" \\ back\\slash', "tab\there\x00nul\x1b[2J", "한국어 ünïcode ••••", "", "x" * 20000])
@pytest.mark.parametrize("when", [0.0, 1_764_849_600.123456, 1e-7, 7_258_118_399.999999])
def test_an_output_record_is_what_json_dumps_makes(text, when):
    expected = json.dumps({"n": 12, "t": when, "s": text}, ensure_ascii=False).encode("utf-8") + b"\n"
    assert runfiles.output_record(12, when, text) == expected
    assert runfiles.checked_record(json.loads(expected)) == runfiles.OutputLine(12, when, text)


def test_the_writer_holds_records_until_flushed_and_writes_them_whole(tmp_path):
    path = tmp_path / runfiles.OUTPUT_FILE
    with runfiles.OutputWriter(tmp_path) as out:
        out.emit("one", 1.0)
        out.emit("two", 2.0)
        assert path.read_bytes() == b"" and out.bytes == len(runfiles.output_record(1, 1.0, "one") + runfiles.output_record(2, 2.0, "two"))
        out.flush()
        assert [line.text for line in runfiles.read_output(tmp_path, 0).lines] == ["one", "two"]
        out.emit("three", 3.0)
    assert [line.text for line in runfiles.read_output(tmp_path, 0).lines] == ["one", "two", "three"]


def test_a_run_slurm_started_on_another_node_takes_that_nodes_name_and_stand_in_devices():
    from agent.allocation import follow_scheduler_node

    policy = {
        "hostname": "node-a",
        "mounts": [["/var/sim/node-a/nvidia1", "/dev/nvidia0", "ro"], ["/work/1/node-a/x", "/job/work", "rw"]],
    }
    moved = follow_scheduler_node(policy, "node-c")
    assert moved["hostname"] == "node-c"
    # The stand-in GPU device follows the node; a directory that merely names it does not.
    assert moved["mounts"] == [["/var/sim/node-c/nvidia1", "/dev/nvidia0", "ro"], ["/work/1/node-a/x", "/job/work", "rw"]]
    assert policy["hostname"] == "node-a"  # the spec's own policy is left as it was
    assert follow_scheduler_node(policy, "node-a") is policy


def test_a_runner_given_several_ranks_specs_runs_none_without_slurms_task_rank(tmp_path, monkeypatch, capsys):
    import sys

    from agent import runner

    monkeypatch.setattr(runner.signal, "signal", lambda *_: None)  # this test process keeps its SIGINT
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    monkeypatch.setattr(sys, "argv", ["agent.runner", str(tmp_path / "rank-0" / runfiles.SPEC_FILE), str(tmp_path / "rank-1" / runfiles.SPEC_FILE)])
    assert runner.main() == 2
    assert "no task rank" in capsys.readouterr().err
    monkeypatch.setenv("SLURM_PROCID", "2")
    assert runner.main() == 2
