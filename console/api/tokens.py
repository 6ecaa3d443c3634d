"""API tokens: username and password → a new token (django-rest-knox: only its SHA-512 digest is
stored; it expires after API_TOKEN_TTL_DAYS). Throttled per client address and locked per username
and per address after repeated failures (``console.lockout``)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import authenticate
from drf_spectacular.utils import OpenApiResponse, extend_schema
from knox.models import AuthToken
from knox.settings import knox_settings
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from console import lockout
from console.api.serializers import TokenRequestSerializer, TokenSerializer

BAD_CREDENTIALS = "Unable to log in with the provided credentials."


class ObtainTokenView(APIView):
    """Username and password → a new API token (send it as ``Authorization: Token <key>``)."""

    # Credentials in the body are the whole authentication: no session, so no CSRF check.
    authentication_classes = ()
    permission_classes = (AllowAny,)
    throttle_classes = (ScopedRateThrottle,)
    throttle_scope = "token"

    @extend_schema(
        summary="Get a new API token",
        request=TokenRequestSerializer,
        responses={
            200: TokenSerializer,
            400: OpenApiResponse(description="bad credentials"),
            429: OpenApiResponse(description="too many requests, or this user is locked after failed sign-ins"),
        },
        auth=[],
        tags=["auth"],
    )
    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = TokenRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        username, password = serializer.validated_data["username"], serializer.validated_data["password"]
        address = lockout.client_address(request)
        refused = lockout.refusal(username, address)
        if refused:
            return Response({"detail": refused}, status=429)
        user = authenticate(request=request._request, username=username, password=password)
        if user is None or not user.is_active:
            lockout.record_failure(username, address)
            raise ValidationError({"non_field_errors": [BAD_CREDENTIALS]})
        lockout.record_success(username)
        instance, token = AuthToken.objects.create(user, expiry=knox_settings.TOKEN_TTL)
        return Response(TokenSerializer({"token": token, "expiry": instance.expiry}).data)
