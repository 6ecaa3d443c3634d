from __future__ import annotations

from django.urls import path

from jobs.consumers import TrainingJobsConsumer

websocket_urlpatterns = [
    path("ws/training-jobs/", TrainingJobsConsumer.as_asgi()),
]
