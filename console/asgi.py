"""ASGI entry point: HTTP through Django, WebSockets through Channels (session or token auth)."""

from __future__ import annotations

import asyncio
import contextlib
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")


def tidy_metrics_dir() -> None:
    """Where ``PROMETHEUS_MULTIPROC_DIR`` is set (the web processes of a host share it): create it,
    and remove the files of processes that no longer run, before this one writes its own.
    prometheus_client names each file by its writer's pid (``counter_1234.db``); the web processes
    start one by one, so none may clear the whole directory under a sibling that runs."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not path:
        return
    os.makedirs(path, mode=0o700, exist_ok=True)
    for name in os.listdir(path):
        stem, _, pid = name.removesuffix(".db").rpartition("_")
        if not (stem and name.endswith(".db") and pid.isdigit()) or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)  # no signal: only asks whether that pid runs on this host
        except ProcessLookupError:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(path, name))
        except PermissionError:
            pass  # it runs, as another user


tidy_metrics_dir()

from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from console.routing import websocket_urlpatterns  # noqa: E402
from console.ws_auth import BrowserOriginValidator, TokenAuthMiddleware  # noqa: E402
from jobs.realtime import remember_server_loop, serve_other_processes  # noqa: E402

websocket_app = BrowserOriginValidator(AuthMiddlewareStack(TokenAuthMiddleware(URLRouter(websocket_urlpatterns))))
router = ProtocolTypeRouter({"http": django_asgi_app, "websocket": websocket_app})


async def application(scope, receive, send):
    """The router, remembering the server's event loop so sync code can publish into it."""
    remember_server_loop()
    return await router(scope, receive, send)


def when_server_ready() -> None:
    """Daphne's ``ready_callable`` (``manage.py runconsole``): once its loop runs, remember it and
    start the local relay, so other processes' status changes reach open pages from the start."""
    _startup.add(asyncio.get_event_loop().create_task(serve_other_processes()))


_startup: set[asyncio.Task] = set()  # the loop keeps only a weak reference to a task
