"""The fleet benchmark's pieces that need no cluster (not in the default test paths: run with
``python -m pytest bench/scale/test_fleetbench.py``)."""

from __future__ import annotations

import json
import math
import time

import pytest

from agent import runfiles
from bench.scale.fleet_figures import batch_figures, figures, fit, spread
from bench.scale.legacy_fleet import SIM_PID_BASE, Silence, SimRunners


def test_spread_ignores_missing_samples():
    assert spread([3.0, None, 1.0, math.nan, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert spread([])["n"] == 0


def test_fit_finds_the_fixed_and_per_job_queries_of_a_round():
    a, b = fit([(1, 14), (10, 23), (100, 113)])
    assert math.isclose(a, 13) and math.isclose(b, 1)
    assert all(math.isnan(x) for x in fit([(5, 7), (5, 9)]))


def test_a_batch_gives_its_placement_rate_latency_and_queries_per_placement(tmp_path):
    t = 1_000_000.0
    attempts = [(t + i * 0.01, t + i * 0.01 + 0.2) for i in range(100)] + [(t + 0.995, None)]
    stats = tmp_path / "rounds.jsonl"
    rounds = [
        {"t": t - 1, "round_s": 0.01, "round_q": 9, "place_q": 5, "placed": 0},  # before the batch: not counted
        {"t": t, "round_s": 0.1, "round_q": 30, "place_q": 25, "placed": 60},
        {"t": t + 0.6, "round_s": 0.1, "round_q": 25, "place_q": 20, "placed": 41},
        {"t": t + 1, "round_s": 0.01, "round_q": 9, "place_q": 5},
    ]
    stats.write_text("".join(json.dumps(r) + "\n" for r in rounds))

    def query(sql, params):
        if "jobs_jobattempt" in sql:
            return attempts
        return [(t + 3.0,)]

    f = batch_figures(query, stats, 1, 101, t - 0.5, t - 0.4, t + 5)
    assert f["attempts"] == 101
    assert math.isclose(f["placed_per_s"], 100 / 0.995)
    assert f["placed_peak_second"] == 101
    assert math.isclose(f["dispatch_p95_s"], 0.2)
    assert math.isclose(f["queries_per_placement"], 50 / 101)
    assert math.isclose(f["queries_fit_per_job"], 5 / 19)
    assert f["empty_round_queries_p50"] == 5
    assert math.isclose(f["makespan_s"], 3.5)


def test_the_table_figures_take_their_spread_over_windows_and_batches():
    side = {
        "idle": {
            "fleet_only": [
                {"tx_per_node_s": 0.1, "tx_per_s": 100, "loadavg_1m": 1, "machine_busy_pct": 50, "cores_used": {}},
                {"tx_per_node_s": 0.3, "tx_per_s": 300, "loadavg_1m": 2, "machine_busy_pct": 60, "cores_used": {}},
            ]
        },
        "batches": [
            {"placed_per_s": 120.0, "load": {"loadavg_1m": 3, "machine_busy_pct": 90, "cores_used": {}}, "nodes_lost": []},
            {"placed_per_s": 80.0, "load": {"loadavg_1m": 4, "machine_busy_pct": 95, "cores_used": {}}, "nodes_lost": ["fleet-0001"]},
        ],
        "lost": {"detected_s": [19.0, 21.0, None]},
    }
    f = figures(side)
    assert f["tx_node"] == {"median": 0.2, "min": 0.1, "max": 0.3, "n": 2}
    assert f["placed_per_s"]["median"] == 100.0
    assert f["batch_nodes_lost"]["max"] == 1
    assert f["lost"]["n"] == 2


def test_the_silence_file_names_the_nodes_that_stop_heartbeating(tmp_path):
    path = tmp_path / "silence"
    silence = Silence(str(path))
    assert "fleet-0001" not in silence
    path.write_text("fleet-0001\n\nfleet-0003\n")
    silence.checked = 0.0
    assert "fleet-0001" in silence and "fleet-0003" in silence and "fleet-0002" not in silence
    path.unlink()
    silence.checked = 0.0
    assert "fleet-0001" not in silence


@pytest.mark.slow  # the simulated runners' thread, waited on
def test_a_simulated_runner_writes_the_run_files_and_never_names_a_real_process(tmp_path):
    runners = SimRunners(0.05)
    runners.thread.start()
    try:
        directory = tmp_path / "rank-0"
        directory.mkdir()
        spec = runfiles.write_spec(directory, runfiles.RunSpec(command="true", cwd=str(tmp_path), env={}))
        run = runners.Popen(["python", "-m", "agent.runner", str(spec)], stdout=runners.STDOUT)
        assert run.pid > SIM_PID_BASE and runners.alive(run.pid) and run.poll() is None
        pid = runfiles.read_pid(directory)
        assert pid is not None and pid.runner_pid == run.pid
        assert pid.pgid is None  # nothing for signal_run or kill_unfinished_runs to signal
        assert [line.number for line in runfiles.read_output(directory, 0).lines] == [1]
        deadline = time.monotonic() + 10
        while run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert run.poll() == 0 and not runners.alive(run.pid)
        ended = runfiles.read_exit(directory)
        assert ended is not None and ended.exit_code == 0
    finally:
        runners.stopped.set()
        runners.wake.set()
