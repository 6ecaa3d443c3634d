"""WebSocket routes of every app."""
from __future__ import annotations

from logs.routing import websocket_urlpatterns as log_routes

websocket_urlpatterns: list = [*log_routes]
