"""Operator commands on nodes. Cordoning is a flag the placement loop reads (jobs already on
the node keep running); fault injection, clearing and spot reclaim are ``failover.services.faults``.
"""

from __future__ import annotations

import logging

from jobs.models import Node
from jobs.services import wakeups

logger = logging.getLogger(__name__)


def set_cordoned(node: Node, cordoned: bool, *, actor: str) -> None:
    Node.objects.filter(pk=node.pk).update(cordoned=cordoned)
    wakeups.round_wanted()  # waiting jobs may fit (or no longer fit) now
    logger.info("node %s: %s by %s", node.name, "cordoned" if cordoned else "uncordoned", actor)
