"""A stand-in training process: prints ``--rate`` lines a second for ``--seconds``.

Every line starts ``t=<time.time() at the print> i=<n>`` and is padded with training-like text
to about ``--width`` characters. Standard library only (it runs as a job's command).
"""

from __future__ import annotations

import argparse
import random
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rate", type=float, default=1000.0)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--delay", type=float, default=0.0, help="seconds to wait before the first line")
    p.add_argument("--width", type=int, default=100)
    args = p.parse_args()
    rng = random.Random(42)
    total = int(args.rate * args.seconds)
    out = sys.stdout
    if args.delay:
        time.sleep(args.delay)
    start = time.monotonic()
    i = 0
    while i < total:
        due = min(total, int((time.monotonic() - start) * args.rate) + 1)
        while i < due:
            body = (
                f"t={time.time():.6f} i={i} step {i // 10} | loss {2.5 * rng.random():.4f} | lr 3.00e-04 "
                f"| tokens/s {rng.randint(40000, 60000)} | grad_norm {rng.random():.3f}"
            )
            if len(body) < args.width:
                body += " " + "." * (args.width - len(body) - 1)
            out.write(body + "\n")
            out.flush()
            i += 1
        time.sleep(0.001)
    return 0


if __name__ == "__main__":
    sys.exit(main())
