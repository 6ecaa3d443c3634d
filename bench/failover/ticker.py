"""The latency bench's workload: a start-up line, then a line every ``--every`` seconds forever.

Standard library only, so the process starts in tens of milliseconds and the figures show the
platform's own failover cost (the goodput part runs a real PyTorch job).
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--every", type=float, default=0.05)
    args = parser.parse_args()
    print(f"Starting dataset initialization (attempt {os.environ.get('JOB_ATTEMPT', '?')})", flush=True)
    n = 0
    while True:
        n += 1
        print(f"tick {n}", flush=True)
        time.sleep(args.every)


if __name__ == "__main__":
    raise SystemExit(main())
