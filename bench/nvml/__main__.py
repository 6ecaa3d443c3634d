"""The NVML probe's watchdog: how long a check takes when a driver call hangs (the first check
waits ``timeout`` for the call, then gives a ``driver_error`` finding), how long the next check
takes while the call is still hung (it fails fast), against a healthy check measured in the same
run. Run: ``python -m bench.nvml`` (``--rounds N``, ``--timeout S``). The simulated driver is
``failover.tests.fake_pynvml`` (the same signatures as pynvml); on a node with a real driver the
healthy check's figure is the one that changes."""

from __future__ import annotations

import argparse
import statistics
import time

from bench.stats import quantile
from failover.nvml import NvmlProbe
from failover.tests import fake_pynvml

HUNG_CALL = "nvmlDeviceGetTotalEccErrors"


def timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def one_round(timeout: float) -> tuple[float, float, float]:
    driver = fake_pynvml.reset(gpus=8)
    probe = NvmlProbe("bench-node", expected_gpus=8, nvml=fake_pynvml, timeout=timeout)
    try:
        probe.check()
        healthy = timed(probe.check)
        gate = driver.hang(HUNG_CALL)
        hung = timed(probe.check)
        still_hung = timed(probe.check)
        gate.set()
        time.sleep(0.02)  # the hung call returns: the probe closes cleanly
        return healthy, hung, still_hung
    finally:
        driver.release()
        probe.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=0.5, help="the watchdog's timeout (NVML_CALL_TIMEOUT), s")
    args = parser.parse_args()
    rows = [one_round(args.timeout) for _ in range(args.rounds)]
    healthy, hung, still = (list(column) for column in zip(*rows, strict=True))
    print(f"NVML probe, 8 simulated GPUs, watchdog timeout {args.timeout:g} s, {args.rounds} rounds")
    for name, values in (("healthy check (baseline)", healthy), ("check with a hung call", hung), ("next check, call still hung", still)):
        median = statistics.median(values)
        print(
            f"  {name:30s} median {median * 1000:8.2f} ms  p10 {quantile(values, 0.1) * 1000:8.2f}  p90 {quantile(values, 0.9) * 1000:8.2f}"
            f"  ×{median / statistics.median(healthy):.1f} the healthy check"
        )
    print(f"  target: a hung call's check within timeout + 0.5 s ({args.timeout + 0.5:g} s); the next one within 0.5 s")


if __name__ == "__main__":
    main()
