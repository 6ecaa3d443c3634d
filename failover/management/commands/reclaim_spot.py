"""Reclaim the spot capacity of a node: its Spot jobs are stopped gracefully and go back to Pending."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from failover.management.nodes import node_named
from failover.services.faults import reclaim_spot


class Command(BaseCommand):
    help = "Reclaim spot capacity on a node (SIGTERM + grace period for its Spot jobs)."

    def add_arguments(self, parser):
        parser.add_argument("node")

    def handle(self, *args, node: str, **options):
        target = node_named(node)
        jobs = reclaim_spot(target, actor="manage.py reclaim_spot")
        self.stdout.write(f"Reclaimed spot capacity on {node}: {len(jobs)} job(s) stopping.")
