"""Benchmarks, one package per area, each run as ``.venv/bin/python -m bench.<area>``:
list, logs, failover, scale, ui, ckpt."""
