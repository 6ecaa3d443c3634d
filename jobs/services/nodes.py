"""Operator commands on nodes. Cordoning is a flag the placement loop reads (jobs already on
the node keep running); fault injection, clearing and spot reclaim are ``failover.services.faults``.
"""
from __future__ import annotations

import logging

from jobs.models import Node

logger = logging.getLogger(__name__)


def set_cordoned(node: Node, cordoned: bool, *, actor: str) -> None:
    Node.objects.filter(pk=node.pk).update(cordoned=cordoned)
    logger.info("node %s: %s by %s", node.name, "cordoned" if cordoned else "uncordoned", actor)
