"""Inject a hardware fault into a simulated GPU: ``inject_fault NODE --gpu N --xid 79``."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from failover.management.nodes import node_named
from failover.models import SimulatedFault
from failover.services.faults import FaultError, inject_fault


class Command(BaseCommand):
    help = "Inject a fault (Xid, ECC, GPU lost, NVLink, thermal) into a simulated node's GPU."

    def add_arguments(self, parser):
        parser.add_argument("node", help="node name, e.g. node-a")
        parser.add_argument("--gpu", type=int, default=None, help="GPU index (default: the whole node)")
        parser.add_argument("--kind", choices=SimulatedFault.Kind.values, default="xid")
        parser.add_argument("--xid", type=int, default=None, help="Xid number for --kind xid (default 79)")

    def handle(self, *args, node: str, gpu: int | None, kind: str, xid: int | None, **options):
        target = node_named(node)
        try:
            fault = inject_fault(target, kind=kind, gpu=gpu, xid=xid, actor="manage.py inject_fault")
        except FaultError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"Injected: {fault}")
