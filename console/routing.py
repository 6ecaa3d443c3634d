"""WebSocket routes of every app (the log tab and live pages add theirs here)."""
from __future__ import annotations

websocket_urlpatterns: list = []
