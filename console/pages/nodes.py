"""The operators' Nodes page: nodes, GPUs, health and running jobs; cordon, faults, spot reclaim.

It lives in ``console`` because it joins two apps (``jobs`` and ``failover``), which never import
each other in a circle.

Staff only. Every action is a POST with the CSRF token that calls one service and comes back to
the page with a message; a bad request is a message too, never a server error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Prefetch
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from agent.launch import containers_ready
from failover.models import HealthEvent, SimulatedFault
from failover.services.faults import FaultError, clear_node, inject_fault, reclaim_spot
from jobs.models import GPU, AttemptNode, JobAttempt, JobExclusion, Node
from jobs.services.nodes import set_cordoned

logger = logging.getLogger(__name__)


@dataclass
class NodeView:
    """A node as the Nodes page shows it: its GPUs, who holds them, open faults, running jobs."""

    node: Node
    gpus: list[GPU]
    faults: list[SimulatedFault]
    placements: list[AttemptNode] = field(default_factory=list)
    events: list[HealthEvent] = field(default_factory=list)  # the latest, newest first
    exclusions: int = 0  # jobs kept off it (or off one of its GPUs) after a fault there

    @property
    def kernel_log_note(self) -> str:
        health = getattr(self.node, "health", None)
        return health.kernel_log_note if health is not None else ""

    @property
    def gpus_free(self) -> int:
        """Healthy GPUs no console job holds and, on a cluster's scheduler, that it has not
        allocated to other work either."""
        free = sum(1 for gpu in self.gpus if gpu.allocated_to_id is None and gpu.healthy)
        if self.node.backend_gpus_in_use is not None:
            free = min(free, max(0, len(self.gpus) - self.node.backend_gpus_in_use))
        return free

    @property
    def gpus_unhealthy(self) -> int:
        return sum(1 for gpu in self.gpus if not gpu.healthy)


def node_overview() -> list[NodeView]:
    """Every node, in name order, with everything the page shows: six queries in all."""
    open_faults = SimulatedFault.objects.filter(cleared_at__isnull=True).order_by("created_at")
    nodes = (
        Node.objects.order_by("name")
        .select_related("health")
        .prefetch_related(
            Prefetch("gpus", queryset=GPU.objects.select_related("allocated_to__attempt__job").order_by("index")),
            Prefetch("simulated_faults", queryset=open_faults, to_attr="open_faults"),
        )
    )
    views = {node.pk: NodeView(node=node, gpus=list(node.gpus.all()), faults=node.open_faults) for node in nodes}
    live = (
        AttemptNode.objects.filter(node_id__in=views, attempt__state__in=[JobAttempt.State.PLACED, JobAttempt.State.RUNNING])
        .select_related("attempt__job")
        .order_by("attempt__job__name", "rank")
    )
    for placement in live:
        views[placement.node_id].placements.append(placement)
    for node_id, count in JobExclusion.objects.filter(node_id__in=views).values("node_id").annotate(n=Count("pk")).values_list("node_id", "n"):
        views[node_id].exclusions = count
    for event in HealthEvent.objects.filter(node_id__in=views).order_by("-at", "-id")[: EVENTS_SHOWN * max(len(views), 1)]:
        if len(views[event.node_id].events) < EVENTS_SHOWN:
            views[event.node_id].events.append(event)
    return list(views.values())


EVENTS_SHOWN = 5


class FaultForm(forms.Form):
    kind = forms.ChoiceField(choices=SimulatedFault.Kind.choices, initial=SimulatedFault.Kind.XID, label="Fault")
    gpu = forms.IntegerField(min_value=0, max_value=64, required=False, label="GPU", help_text="empty: the whole node")
    xid = forms.IntegerField(min_value=1, max_value=1000, required=False, label="Xid", help_text="for an Xid fault, e.g. 79")


def staff_only(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @login_required
    def wrapped(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if not request.user.is_staff:
            raise PermissionDenied("The Nodes page is for operators.")
        return view(request, *args, **kwargs)

    wrapped.__name__ = view.__name__
    wrapped.__doc__ = view.__doc__
    return wrapped


@staff_only
@require_GET
def node_list(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "nodes/node_list.html",
        {"nodes": node_overview(), "fault_kinds": SimulatedFault.Kind.choices, "nav": "nodes", "sandbox": sandbox_state()},
    )


def sandbox_state() -> dict:
    ready, why = containers_ready()
    return {"off": settings.JOB_SANDBOX == "off", "ready": ready, "why": why}


def inject(request: HttpRequest, node: Node) -> None:
    form = FaultForm(request.POST)
    if not form.is_valid():
        problems = "; ".join(f"{form.fields[name].label}: {' '.join(map(str, errors))}" for name, errors in form.errors.items())
        messages.error(request, f"No fault injected into {node.name}. {problems}")
        return
    data = form.cleaned_data
    xid = data["xid"] if data["kind"] == SimulatedFault.Kind.XID else None
    try:
        fault = inject_fault(node, kind=data["kind"], gpu=data["gpu"], xid=xid, actor=request.user.get_username())
    except FaultError as exc:
        messages.error(request, str(exc))
        return
    messages.success(request, f"Injected: {fault}. Jobs on it stop within a few seconds and fail over.")


def reclaim(request: HttpRequest, node: Node) -> None:
    job_ids = reclaim_spot(node, actor=request.user.get_username())
    count = len(job_ids)
    messages.success(request, f"Spot capacity on {node.name} reclaimed: {count} Spot job{'s' if count != 1 else ''} stopping.")


def cordon(request: HttpRequest, node: Node) -> None:
    set_cordoned(node, True, actor=request.user.get_username())
    messages.success(request, f"{node.name} cordoned: no new jobs are placed on it.")


def uncordon(request: HttpRequest, node: Node) -> None:
    set_cordoned(node, False, actor=request.user.get_username())
    messages.success(request, f"{node.name} uncordoned.")


def clear(request: HttpRequest, node: Node) -> None:
    clear_node(node, actor=request.user.get_username())
    messages.success(request, f"{node.name} cleared: its faults are repaired and it is healthy again.")


ACTIONS: dict[str, Callable[[HttpRequest, Node], None]] = {
    "cordon": cordon,
    "uncordon": uncordon,
    "inject": inject,
    "clear": clear,
    "reclaim": reclaim,
}


@staff_only
@require_POST
def node_action(request: HttpRequest, name: str, action: str) -> HttpResponse:
    run = ACTIONS.get(action)
    if run is None:
        raise Http404("No such node action.")
    node = get_object_or_404(Node, name=name)
    run(request, node)
    return redirect("nodes:list")
