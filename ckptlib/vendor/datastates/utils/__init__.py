"""``datastates.utils.get_logger`` as upstream: an INFO logger writing to stdout."""

from __future__ import annotations

import logging
import sys

__all__ = ["get_logger"]


def get_logger(logger_name: str) -> logging.Logger:
    """The named logger at INFO with one stdout handler in upstream's format (added once)."""
    logger = logging.getLogger(logger_name)
    logger.setLevel(logging.INFO)
    if not any(getattr(h, "_datastates_stdout", False) for h in logger.handlers):
        handler = logging.StreamHandler(stream=sys.stdout)
        handler._datastates_stdout = True  # type: ignore[attr-defined]
        handler.setLevel(logging.INFO)
        handler.setFormatter(logging.Formatter("[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] %(message)s"))
        logger.addHandler(handler)
    return logger
