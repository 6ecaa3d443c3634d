"""Benchmark of the fair-share queue: ``python -m bench.queue`` (see __main__)."""
