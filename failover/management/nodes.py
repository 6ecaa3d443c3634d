"""What the operator commands share: the node they name."""

from __future__ import annotations

from django.core.management.base import CommandError

from jobs.models import Node


def node_named(name: str) -> Node:
    node = Node.objects.filter(name=name).first()
    if node is None:
        raise CommandError(f"No node named {name!r}.")
    return node
