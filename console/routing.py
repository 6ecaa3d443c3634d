"""WebSocket routes of every app."""
from __future__ import annotations

from jobs.routing import websocket_urlpatterns as job_routes
from logs.routing import websocket_urlpatterns as log_routes

websocket_urlpatterns: list = [*job_routes, *log_routes]
