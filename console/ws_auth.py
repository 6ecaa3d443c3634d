"""WebSocket authentication: the session cookie (Channels' AuthMiddleware) or an API token in an
``Authorization: Token …`` header."""
from __future__ import annotations

from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware
from channels.security.websocket import AllowedHostsOriginValidator
from knox.auth import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed


@database_sync_to_async
def user_for_token(key: str):
    """The active user of an unexpired API token (knox compares digests), else None."""
    try:
        user, _token = TokenAuthentication().authenticate_credentials(key.encode("utf-8"))
    except (AuthenticationFailed, UnicodeError):
        return None
    return user if user.is_active else None


class TokenAuthMiddleware(BaseMiddleware):
    async def __call__(self, scope, receive, send):
        user = scope.get("user")
        if user is None or not user.is_authenticated:
            header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
            kind, _, key = header.partition(" ")
            if kind.lower() == "token" and key.strip():
                found = await user_for_token(key.strip())
                if found is not None:
                    scope = {**scope, "user": found}
        return await super().__call__(scope, receive, send)


class BrowserOriginValidator:
    """Refuse cross-site browser sockets (their Origin is not an allowed host); let non-browser
    clients, which send no Origin and authenticate by token, through."""

    def __init__(self, application) -> None:

        self.checked = AllowedHostsOriginValidator(application)
        self.application = application

    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers") or [])
        if b"origin" not in headers:
            return await self.application(scope, receive, send)
        return await self.checked(scope, receive, send)
