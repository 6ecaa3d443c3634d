"""Fault handling in the operators' admin: the Node admin gains the failover actions (inject a
fault into a simulated GPU, mark healthy, reclaim spot capacity), and the injected faults and
health readings are listed (read-only: faults are made through ``inject_fault`` only)."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from failover.models import HealthEvent, NodeHealth, SimulatedFault
from failover.services.faults import FaultError, clear_node, inject_fault, reclaim_spot
from jobs.admin import NodeAdmin
from jobs.models import Node


class FailoverNodeAdmin(NodeAdmin):
    actions = (*NodeAdmin.actions, "inject_xid79", "inject_ecc", "mark_healthy", "reclaim_spot_capacity")

    def inject(self, request: HttpRequest, queryset: QuerySet[Node], kind: str) -> None:
        for node in queryset:
            try:
                fault = inject_fault(node, kind=kind, gpu=0, actor=request.user.get_username())
            except FaultError as exc:
                self.message_user(request, str(exc), messages.ERROR)
            else:
                self.message_user(request, f"Injected: {fault}.", messages.WARNING)

    @admin.action(description="Inject a GPU fault (Xid 79, GPU fell off the bus) into GPU 0 of selected simulated nodes")
    def inject_xid79(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        self.inject(request, queryset, "xid")

    @admin.action(description="Inject an uncorrectable ECC error into GPU 0 of selected simulated nodes")
    def inject_ecc(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        self.inject(request, queryset, "ecc")

    @admin.action(description="Mark selected nodes healthy (repaired: clears faults and readings)")
    def mark_healthy(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        for node in queryset:
            clear_node(node, actor=request.user.get_username())
        self.message_user(request, f"{queryset.count()} node(s) healthy again.", messages.SUCCESS)

    @admin.action(description="Reclaim spot capacity on selected nodes (Spot jobs stop gracefully, resume later)")
    def reclaim_spot_capacity(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        jobs = [job for node in queryset for job in reclaim_spot(node, actor=request.user.get_username())]
        self.message_user(request, f"Reclaimed spot capacity: {len(jobs)} Spot job(s) stopping.", messages.WARNING)


admin.site.unregister(Node)
admin.site.register(Node, FailoverNodeAdmin)


@admin.register(SimulatedFault)
class SimulatedFaultAdmin(admin.ModelAdmin):
    list_display = ("__str__", "node", "gpu", "kind", "xid", "created_at", "created_by", "applied_at", "cleared_at")
    list_filter = ("kind", "node")
    list_select_related = ("node",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


@admin.register(NodeHealth)
class NodeHealthAdmin(admin.ModelAdmin):
    """When each node was last read; its evidence is under Health events."""

    list_display = ("node", "source", "checked_at", "cleared_at", "kernel_log_note")
    readonly_fields = ("node", "source", "checked_at", "cleared_at", "kernel_log_note")
    list_select_related = ("node",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(HealthEvent)
class HealthEventAdmin(admin.ModelAdmin):
    """What the agents' health monitors saw (read-only; pruned by age)."""

    list_display = ("at", "node", "gpu", "nic", "kind", "xid", "value", "fatal", "source", "message")
    list_filter = ("fatal", "kind", "source", "node")
    list_select_related = ("node",)
    date_hierarchy = "at"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False
