"""``datastates.utils.datastates_logger`` as upstream: ``get_logger``."""

from __future__ import annotations

from datastates.utils import get_logger

__all__ = ["get_logger"]
