"""Log pipeline benchmark: ingest throughput, print → WebSocket latency, tail of a 1M-line log.

Run from the repository root: ``.venv/bin/python -m bench.logs`` (``--quick`` for a short run,
``--help`` for the knobs). Standard library + the project's own environment; the WebSocket client
is a minimal RFC 6455 client in :mod:`bench.logs.wsclient`.
"""
