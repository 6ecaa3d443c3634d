"""python -m bench.idle: an idle embedded console's database transactions per second, and its placement latency."""
