"""Staff API for fault handling: inject a fault into a simulated GPU, clear a node, reclaim spot."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.permissions import IsAdminUser
from rest_framework.response import Response
from rest_framework.views import APIView

from failover.models import SimulatedFault
from failover.services.faults import FaultError, clear_node, inject_fault, reclaim_spot
from jobs.models import Node


class FaultRequest(serializers.Serializer):
    kind = serializers.ChoiceField(choices=SimulatedFault.Kind.values, default="xid")
    gpu = serializers.IntegerField(min_value=0, max_value=64, required=False, allow_null=True, default=None)
    xid = serializers.IntegerField(min_value=1, max_value=1000, required=False, allow_null=True, default=None)


class FaultResponse(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name")

    class Meta:
        model = SimulatedFault
        fields = ["id", "node", "gpu", "kind", "xid", "created_at", "created_by"]


Detail = inline_serializer("Detail", {"detail": serializers.CharField()})


class InjectFaultView(APIView):
    permission_classes = [IsAdminUser]

    @extend_schema(
        request=FaultRequest,
        responses={201: FaultResponse, 400: OpenApiResponse(description="Bad fault"), 404: Detail},
        summary="Inject a hardware fault into a simulated node's GPU",
    )
    def post(self, request, name: str):
        node = get_object_or_404(Node, name=name)
        payload = FaultRequest(data=request.data)
        payload.is_valid(raise_exception=True)
        try:
            fault = inject_fault(node, actor=request.user.get_username(), **payload.validated_data)
        except FaultError as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_400_BAD_REQUEST)
        return Response(FaultResponse(fault).data, status=status.HTTP_201_CREATED)


class ClearNodeView(APIView):
    permission_classes = [IsAdminUser]

    @extend_schema(request=None, responses={200: Detail, 404: Detail}, summary="Mark a node healthy again")
    def post(self, request, name: str):
        node = get_object_or_404(Node, name=name)
        clear_node(node, actor=request.user.get_username())
        return Response({"detail": f"{node.name} is healthy again."})


class ReclaimSpotView(APIView):
    permission_classes = [IsAdminUser]

    @extend_schema(
        request=None,
        responses={200: inline_serializer("Reclaimed", {"jobs": serializers.ListField(child=serializers.IntegerField())}), 404: Detail},
        summary="Reclaim spot capacity on a node",
    )
    def post(self, request, name: str):
        node = get_object_or_404(Node, name=name)
        return Response({"jobs": reclaim_spot(node, actor=request.user.get_username())})
