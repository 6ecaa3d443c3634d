"""A browser's WebSocket (one that sends Origin) is accepted only from the console's own origin,
exactly (scheme, host and port, as the request's Host names it), or from CSRF_TRUSTED_ORIGINS;
clients that send no Origin (the CLI, with a token) pass the check."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from console.ws_auth import BrowserOriginValidator, parse_origin
from harness.sockets import Communicator

# Channels' consumers (the denier too) close stale database connections on each message.
pytestmark = [pytest.mark.asyncio, pytest.mark.django_db]


class Accepting(AsyncWebsocketConsumer):
    async def connect(self):
        await self.accept()


async def connects(headers: list[tuple[bytes, bytes]], *, scheme: str = "ws") -> bool:
    communicator = Communicator(BrowserOriginValidator(Accepting.as_asgi()), "/ws/training-jobs/", headers=headers)
    communicator.scope["scheme"] = scheme
    connected, _ = await communicator.connect()
    await communicator.disconnect()
    return connected


def browser(origin: bytes, host: bytes = b"localhost:8000") -> list[tuple[bytes, bytes]]:
    return [(b"host", host), (b"origin", origin)]


@pytest.mark.parametrize(
    "origin, host, scheme",
    [
        (b"http://localhost:8000", b"localhost:8000", "ws"),
        (b"http://LOCALHOST:8000", b"localhost:8000", "ws"),
        (b"http://127.0.0.1:8000", b"127.0.0.1:8000", "ws"),
        (b"http://[::1]:8000", b"[::1]:8000", "ws"),
        (b"http://localhost", b"localhost:80", "ws"),  # default ports are the same port
        (b"http://localhost:80", b"localhost", "ws"),
        (b"https://localhost", b"localhost", "wss"),
        (b"https://localhost:443", b"localhost", "wss"),
    ],
)
async def test_a_page_of_the_consoles_own_origin_connects(origin, host, scheme):
    assert await connects(browser(origin, host), scheme=scheme)


@pytest.mark.parametrize(
    "origin, host, scheme",
    [
        (b"http://localhost:9999", b"localhost:8000", "ws"),  # another port on the same machine
        (b"http://localhost", b"localhost:8000", "ws"),
        (b"http://127.0.0.1:8000", b"localhost:8000", "ws"),  # another host, same machine
        (b"http://evil.example:8000", b"localhost:8000", "ws"),
        (b"http://evil.example:8000", b"evil.example:8000", "ws"),  # DNS rebinding: not an allowed host
        (b"https://localhost:8000", b"localhost:8000", "ws"),  # another scheme
        (b"http://localhost", b"localhost", "wss"),
        (b"null", b"localhost:8000", "ws"),
        (b"", b"localhost:8000", "ws"),
        (b"http://localhost:8000/page", b"localhost:8000", "ws"),
        (b"http://user@localhost:8000", b"localhost:8000", "ws"),
        (b"file://", b"localhost:8000", "ws"),
        (b"http://localhost:99999", b"localhost:8000", "ws"),
    ],
)
async def test_a_page_of_any_other_origin_is_refused(origin, host, scheme):
    assert not await connects(browser(origin, host), scheme=scheme)


async def test_a_browser_socket_without_a_host_header_is_refused():
    assert not await connects([(b"origin", b"http://localhost:8000")])


async def test_a_client_without_origin_passes_the_check():
    assert await connects([(b"host", b"localhost:8000")])
    assert await connects([])


async def test_csrf_trusted_origins_are_accepted_exactly(settings):
    settings.CSRF_TRUSTED_ORIGINS = ["https://console.example.org", "https://*.example.net"]
    assert await connects(browser(b"https://console.example.org", b"127.0.0.1:8001"))
    assert await connects(browser(b"https://console.example.org:443", b"127.0.0.1:8001"))
    assert await connects(browser(b"https://a.example.net", b"127.0.0.1:8001"))
    assert not await connects(browser(b"https://console.example.org:8443", b"127.0.0.1:8001"))
    assert not await connects(browser(b"http://console.example.org", b"127.0.0.1:8001"))
    assert not await connects(browser(b"https://other.example.org", b"127.0.0.1:8001"))
    assert not await connects(browser(b"https://example.net", b"127.0.0.1:8001"))
    assert not await connects(browser(b"https://a.example.net.evil", b"127.0.0.1:8001"))


async def test_behind_an_https_proxy_the_origin_is_https(settings):
    settings.ALLOWED_HOSTS = ["console.example.org"]
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    proxied = [(b"x-forwarded-proto", b"https")]
    assert await connects(browser(b"https://console.example.org", b"console.example.org") + proxied)
    assert not await connects(browser(b"http://console.example.org", b"console.example.org") + proxied)
    assert await connects(browser(b"http://console.example.org", b"console.example.org"))


async def test_origins_are_parsed_strictly():
    assert parse_origin("HTTP://Example.ORG") == ("http", "example.org", 80)
    assert parse_origin("https://[::1]:8443") == ("https", "::1", 8443)
    assert parse_origin("null") is None
    assert parse_origin("ws://localhost:8000") is None
    assert parse_origin("http://localhost:8000?x") is None


@pytest.mark.django_db(transaction=True)
async def test_the_consoles_socket_takes_its_own_origin_and_refuses_another_port(owner):
    from django.test import Client

    from console.asgi import application

    client = Client()
    await database_sync_to_async(client.force_login)(owner)
    cookie = (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())

    async def opens(origin: bytes) -> bool:
        communicator = Communicator(application, "/ws/training-jobs/", headers=[cookie, *browser(origin)])
        connected, _ = await communicator.connect()
        await communicator.disconnect()
        return connected

    assert await opens(b"http://localhost:8000")
    assert not await opens(b"http://localhost:9999")
    assert not await opens(b"null")
