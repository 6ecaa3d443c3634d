"""WebSocket routes: the job list and detail pages' status socket, and each job's log socket."""

from __future__ import annotations

from django.urls import path

from console.consumers import TrainingJobsConsumer
from logs.routing import websocket_urlpatterns as log_routes

websocket_urlpatterns: list = [
    path("ws/training-jobs/", TrainingJobsConsumer.as_asgi()),
    *log_routes,
]
