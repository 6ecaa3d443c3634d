"""Clear a node after repair: its faults are gone and it takes jobs again."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from failover.management.nodes import node_named
from failover.services.faults import clear_node


class Command(BaseCommand):
    help = "Mark a node healthy again (clears injected faults and health findings)."

    def add_arguments(self, parser):
        parser.add_argument("node")

    def handle(self, *args, node: str, **options):
        target = node_named(node)
        clear_node(target, actor="manage.py clear_node")
        self.stdout.write(f"{node} is healthy again.")
