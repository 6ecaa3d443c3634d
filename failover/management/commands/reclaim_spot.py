"""Reclaim the spot capacity of a node: its Spot jobs are stopped gracefully and go back to Pending."""
from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from failover.services.faults import reclaim_spot
from jobs.models import Node


class Command(BaseCommand):
    help = "Reclaim spot capacity on a node (SIGTERM + grace period for its Spot jobs)."

    def add_arguments(self, parser):
        parser.add_argument("node")

    def handle(self, *args, node: str, **options):
        target = Node.objects.filter(name=node).first()
        if target is None:
            raise CommandError(f"No node named {node!r}.")
        jobs = reclaim_spot(target, actor="manage.py reclaim_spot")
        self.stdout.write(f"Reclaimed spot capacity on {node}: {len(jobs)} job(s) stopping.")
