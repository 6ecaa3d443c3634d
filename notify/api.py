"""The notifications API: a user's subscriptions (create, list, change, delete) and each one's
delivery log. ``/api/v1/notifications/subscriptions/``."""
from __future__ import annotations

from urllib.parse import urlsplit

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.response import Response

from jobs.models import Project, TrainingJob
from notify.models import Delivery, Kind, Subscription


class SubscriptionSerializer(serializers.ModelSerializer):
    job = serializers.PrimaryKeyRelatedField(
        queryset=TrainingJob.objects.none(), required=False, allow_null=True,
        help_text="Only this job (id). Leave job and project empty for every job you own.",
        error_messages={"does_not_exist": "No such training job, or you may not see it."},
    )
    project = serializers.PrimaryKeyRelatedField(
        queryset=Project.objects.none(), required=False, allow_null=True,
        help_text="Every job of this project (id); you must be a member.",
        error_messages={"does_not_exist": "Project {pk_value} does not exist or you are not a member of it."},
    )
    kinds = serializers.MultipleChoiceField(choices=Kind.choices, required=False, allow_empty=False,
                                            help_text="terminal, failover, internalerror, preemption (default: all).")
    scope = serializers.CharField(read_only=True)

    class Meta:
        model = Subscription
        fields = ["id", "channel", "email", "url", "slack", "job", "project", "scope", "kinds", "active", "secret", "created_at"]
        read_only_fields = ["secret", "created_at"]
        extra_kwargs = {"secret": {"help_text": "HMAC-SHA256 key of the X-Satrain-Signature header."}}

    def get_fields(self):
        fields = super().get_fields()
        request = self.context.get("request")
        if request is not None and request.user.is_authenticated:
            fields["job"].queryset = TrainingJob.objects.visible_to(request.user)
            fields["project"].queryset = Project.objects.for_user(request.user)
        return fields

    def to_representation(self, instance):
        data = super().to_representation(instance)
        data["kinds"] = sorted(instance.kinds)
        return data

    def validate(self, data):
        merged = {**({} if self.instance is None else {f: getattr(self.instance, f) for f in ("channel", "email", "url", "job", "project")}), **data}
        channel = merged.get("channel")
        if channel == Subscription.Channel.EMAIL and not merged.get("email"):
            raise serializers.ValidationError({"email": ["An e-mail subscription needs an address."]})
        if channel == Subscription.Channel.WEBHOOK:
            url = merged.get("url") or ""
            if urlsplit(url).scheme not in ("http", "https"):
                raise serializers.ValidationError({"url": ["A webhook needs an http:// or https:// URL."]})
        if merged.get("job") is not None and merged.get("project") is not None:
            raise serializers.ValidationError({"project": ["Choose one job or one project, not both."]})
        if "kinds" in data:
            data["kinds"] = sorted(data["kinds"])
        return data


class DeliverySerializer(serializers.ModelSerializer):
    job = serializers.IntegerField(source="event.job_id", read_only=True)
    from_status = serializers.CharField(source="event.from_status", read_only=True)
    to_status = serializers.CharField(source="event.to_status", read_only=True)

    class Meta:
        model = Delivery
        fields = ["id", "event", "job", "from_status", "to_status", "kind", "state", "attempts", "last_status", "last_error",
                  "next_try_at", "created_at", "delivered_at"]
        read_only_fields = fields


@extend_schema(tags=["notifications"])
class SubscriptionViewSet(viewsets.ModelViewSet):
    serializer_class = SubscriptionSerializer
    parser_classes = [JSONParser]
    pagination_class = None
    lookup_value_regex = r"[0-9]{1,18}"
    queryset = Subscription.objects.none()
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self) -> QuerySet[Subscription]:
        return Subscription.objects.filter(user=self.request.user).select_related("project")

    def get_object(self) -> Subscription:
        found = self.get_queryset().filter(pk=int(self.kwargs["pk"])).first()
        if found is None:
            raise NotFound("No such subscription.")
        return found

    def perform_create(self, serializer):
        serializer.save(user=self.request.user)

    @extend_schema(summary="A subscription's delivery log (the latest 100)", responses={200: DeliverySerializer(many=True)})
    @action(detail=True, methods=["get"])
    def deliveries(self, request: Request, pk: str | None = None) -> Response:
        subscription = self.get_object()
        rows = subscription.deliveries.select_related("event").order_by("-created_at", "-id")[:100]
        return Response(DeliverySerializer(rows, many=True).data)
