"""``python -m ckptlib vendor-path``: prints the directory for ``CHECKPOINT_VENDOR``."""

from __future__ import annotations

import argparse
import sys

from ckptlib import vendor_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ckptlib")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("vendor-path", help="print the datastates vendor directory (CHECKPOINT_VENDOR)")
    parser.parse_args(argv)
    print(vendor_path())
    return 0


if __name__ == "__main__":
    sys.exit(main())
