"""Benchmark of ckptlib on the seed's Spot script: time added per save against the Trainer's own.

Run from the repository root: ``python -m bench.spot`` (``--rounds``, ``--steps``, ``--hidden``, ``--layers``).
"""
