"""Benchmark of ckptlib against the Trainer's synchronous save and DCP ``async_save``.

Run from the repository root: ``python -m bench.ckpt`` (``--size-gb``, ``--every``, ``--cycles``, ``--rounds``).
"""
