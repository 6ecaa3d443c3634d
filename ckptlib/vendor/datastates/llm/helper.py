"""``datastates.llm.helper`` as upstream: see ``datastates.helper``."""

from __future__ import annotations

from datastates.helper import *  # noqa: F403
from datastates.helper import __all__ as __all__
