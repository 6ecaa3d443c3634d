"""The notifications API: a user's subscriptions (create, list, change, delete; at most
``NOTIFY_MAX_SUBSCRIPTIONS_PER_USER``), each one's delivery log, and asking again for an e-mail
address's confirmation link. ``/api/v1/notifications/subscriptions/``."""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings
from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from jobs.models import Project, TrainingJob
from jobs.rest import JSONParser
from notify import handoff, services, verification
from notify.models import Delivery, Kind, Subscription


class SubscriptionSerializer(serializers.ModelSerializer):
    job = serializers.PrimaryKeyRelatedField(
        queryset=TrainingJob.objects.none(),
        required=False,
        allow_null=True,
        help_text="Only this job (id). Leave job and project empty for every job you own.",
        error_messages={"does_not_exist": "No such training job, or you may not see it."},
    )
    project = serializers.PrimaryKeyRelatedField(
        queryset=Project.objects.none(),
        required=False,
        allow_null=True,
        help_text="Every job of this project (id); you must be a member.",
        error_messages={"does_not_exist": "Project {pk_value} does not exist or you are not a member of it."},
    )
    kinds = serializers.MultipleChoiceField(
        choices=Kind.choices, required=False, allow_empty=False, help_text="terminal, failover, internalerror, preemption (default: all)."
    )
    scope = serializers.CharField(read_only=True)
    email_verified = serializers.SerializerMethodField(
        help_text="E-mail: whether the address's holder opened the confirmation link; nothing is sent before. Webhooks: null."
    )

    class Meta:
        model = Subscription
        fields = [
            "id",
            "channel",
            "email",
            "email_verified",
            "url",
            "slack",
            "job",
            "project",
            "scope",
            "kinds",
            "active",
            "secret",
            "created_at",
        ]
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

    def get_email_verified(self, subscription: Subscription) -> bool | None:
        return subscription.email_verified_at is not None if subscription.channel == Subscription.Channel.EMAIL else None

    def validate(self, data):
        merged = {**({} if self.instance is None else {f: getattr(self.instance, f) for f in ("channel", "email", "url", "job", "project")}), **data}
        user = self.context["request"].user
        if self.instance is None and services.subscriptions_left(user.pk) <= 0:
            raise serializers.ValidationError(
                {"non_field_errors": [f"You have {settings.NOTIFY_MAX_SUBSCRIPTIONS_PER_USER} subscriptions, the most allowed: delete one first."]}
            )
        channel = merged.get("channel")
        if channel == Subscription.Channel.EMAIL and not merged.get("email"):
            raise serializers.ValidationError({"email": ["An e-mail subscription needs an address."]})
        if channel == Subscription.Channel.EMAIL and self.needs_confirmation(merged):
            refused = verification.refusal(user.pk)
            if refused:
                raise serializers.ValidationError({"email": [refused]})
        if channel == Subscription.Channel.WEBHOOK:
            url = merged.get("url") or ""
            if urlsplit(url).scheme not in ("http", "https"):
                raise serializers.ValidationError({"url": ["A webhook needs an http:// or https:// URL."]})
            if self.instance is None or "url" in data or "channel" in data:
                refused = services.destination_refusal(url)
                if refused:
                    raise serializers.ValidationError({"url": [refused]})
        if merged.get("job") is not None and merged.get("project") is not None:
            raise serializers.ValidationError({"project": ["Choose one job or one project, not both."]})
        if "kinds" in data:
            data["kinds"] = sorted(data["kinds"])
        return data

    def needs_confirmation(self, merged: dict) -> bool:
        """A new e-mail subscription, or a changed address, that this user has not confirmed yet."""
        instance = self.instance
        changed = instance is None or instance.channel != merged["channel"] or instance.email != merged["email"]
        besides = instance.pk if instance is not None else None
        return changed and not verification.already_verified(self.context["request"].user.pk, merged["email"], besides=besides)

    def create(self, validated_data):
        subscription = super().create(validated_data)
        handoff.confirmation_requested(subscription)
        return subscription

    def update(self, instance, validated_data):
        before = (instance.channel, instance.email)
        after = (validated_data.get("channel", instance.channel), validated_data.get("email", instance.email))
        if after != before:
            instance.email_verified_at = None  # the new address's holder has not agreed yet
        subscription = super().update(instance, validated_data)
        if after != before:
            handoff.confirmation_requested(subscription)
        return subscription


class DeliverySerializer(serializers.ModelSerializer):
    job = serializers.IntegerField(source="event.job_id", read_only=True)
    from_status = serializers.CharField(source="event.from_status", read_only=True)
    to_status = serializers.CharField(source="event.to_status", read_only=True)

    class Meta:
        model = Delivery
        fields = [
            "id",
            "event",
            "job",
            "from_status",
            "to_status",
            "kind",
            "state",
            "attempts",
            "last_status",
            "last_error",
            "next_try_at",
            "created_at",
            "delivered_at",
        ]
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

    @extend_schema(
        summary="Mail an e-mail subscription's confirmation link again",
        request=None,
        responses={202: None, 400: OpenApiResponse(description="not an unconfirmed e-mail subscription, or too many links asked for")},
    )
    @action(detail=True, methods=["post"], url_path="send-confirmation")
    def send_confirmation(self, request: Request, pk: str | None = None) -> Response:
        subscription = self.get_object()
        if not subscription.awaiting_verification:
            raise ValidationError({"detail": "This subscription has no address waiting for confirmation."})
        refused = verification.refusal(request.user.pk, subscription)
        if refused:
            raise ValidationError({"detail": refused})
        handoff.confirmation_requested(subscription)
        return Response({"detail": f"A confirmation link is on its way to {subscription.email}."}, status=202)

    @extend_schema(summary="A subscription's delivery log (the latest 100)", responses={200: DeliverySerializer(many=True)})
    @action(detail=True, methods=["get"])
    def deliveries(self, request: Request, pk: str | None = None) -> Response:
        subscription = self.get_object()
        rows = subscription.deliveries.select_related("event").order_by("-created_at", "-id")[:100]
        return Response(DeliverySerializer(rows, many=True).data)
