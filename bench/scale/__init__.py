"""Benchmark: placement and dispatch at scale — 1,000 queued short jobs over 16 node agents.

    .venv/bin/python -m bench.scale [--jobs 1000] [--agents 16] [--gpus-per-agent 8] [--quick]

Runs the scale-out deployment on loopback: a fresh PostgreSQL database, a flushed Redis
database, the control worker with beat (instrumented: ``bench/scale/control.py``) and one
``manage.py nodeagent --simulated`` process per node. Queues short jobs (``python -c pass``, one
GPU each) and follows them until all are Completed. Figures: placement throughput (jobs per
second), dispatch latency (attempt created → the agent's ``run_started``) p50/p95/p99 with its
parts, SQL queries per placement, time until all jobs are done and where the CPU went. Baseline
in the same run: the same jobs over fewer agents (``--baseline-agents``, a quarter by default).

At fleet size (N simulated nodes in one process, today's code in the same run as the baseline):
``python -m bench.scale.fleetbench`` (``bench/scale/fleetbench.py``; docs/benchmarks.md).
"""
