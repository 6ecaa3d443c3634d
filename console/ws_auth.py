"""WebSocket authentication: the session cookie (Channels' AuthMiddleware) or an API token in an
``Authorization: Token …`` header; and the check that a browser's socket comes from the console's
own pages (``BrowserOriginValidator``)."""

from __future__ import annotations

from urllib.parse import urlsplit

from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware
from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain
from knox.auth import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed

DEFAULT_PORTS = {"http": 80, "https": 443}
WEB_SCHEMES = {"ws": "http", "wss": "https", "http": "http", "https": "https"}

Origin = tuple[str, str, int]  # scheme, host (lower case, IPv6 without brackets), port


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


def parse_origin(text: str) -> Origin | None:
    """``scheme://host[:port]`` as an origin with its port made explicit; None for anything else
    (``null``, a path, credentials, an unknown scheme, a bad port)."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname or parts.username is not None or parts.password is not None:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return None
    return scheme, parts.hostname.lower(), port if port is not None else DEFAULT_PORTS[scheme]


def allowed_hosts() -> list[str]:
    """ALLOWED_HOSTS, as Django's ``HttpRequest.get_host`` reads it."""
    if settings.DEBUG and not settings.ALLOWED_HOSTS:
        return [".localhost", "127.0.0.1", "[::1]"]
    return list(settings.ALLOWED_HOSTS)


def own_origin(scope, headers: dict[bytes, bytes]) -> Origin | None:
    """The console's origin as the request names it: its Host header (one ALLOWED_HOSTS allows)
    with the socket's scheme (``wss`` → https, or https where SECURE_PROXY_SSL_HEADER says so).
    None without a Host header, or with one Django's pages would refuse too."""
    host = headers.get(b"host", b"").decode("latin-1").strip()
    domain, _port = split_domain_port(host)
    if not domain or not validate_host(domain, allowed_hosts()):
        return None
    scheme = WEB_SCHEMES.get(str(scope.get("scheme") or "ws").lower())
    proxy = settings.SECURE_PROXY_SSL_HEADER
    if proxy:
        name, secure_value = proxy
        header = name.lower().removeprefix("http_").replace("_", "-").encode("latin-1")
        if header in headers:
            scheme = "https" if headers[header].decode("latin-1").split(",")[0].strip() == secure_value else "http"
    return parse_origin(f"{scheme}://{host}") if scheme else None


def trusted(origin: Origin, patterns: list[str]) -> bool:
    """Whether ``origin`` is one of CSRF_TRUSTED_ORIGINS (``https://*.example.com`` included, as
    Django's CSRF check reads it: that domain's subdomains)."""
    scheme, host, port = origin
    for pattern in patterns:
        wildcard = "://*." in pattern
        found = parse_origin(pattern.replace("://*.", "://", 1))
        if found is None or (found[0], found[2]) != (scheme, port):
            continue
        if (is_same_domain(host, "." + found[1]) and host != found[1]) if wildcard else host == found[1]:
            return True
    return False


def origin_allowed(scope) -> bool:
    """A socket with an Origin header (a browser's) is allowed when that origin is exactly the
    console's own (scheme, host and port) or one of CSRF_TRUSTED_ORIGINS."""
    headers = dict(scope.get("headers") or [])
    origin = parse_origin(headers[b"origin"].decode("latin-1"))
    if origin is None:
        return False
    return origin == own_origin(scope, headers) or trusted(origin, list(settings.CSRF_TRUSTED_ORIGINS))


class BrowserOriginValidator:
    """Refuse cross-origin browser sockets: a page of another origin (another host, scheme or port,
    even on this machine, or ``null``) may not open a socket with the user's cookie. Non-browser
    clients, which send no Origin and authenticate by token, pass."""

    def __init__(self, application) -> None:
        self.application = application

    async def __call__(self, scope, receive, send):
        if b"origin" not in dict(scope.get("headers") or []) or origin_allowed(scope):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)
