from django.urls import path

from logs.consumers import JobLogConsumer

websocket_urlpatterns = [
    path("ws/training-jobs/<int:job_id>/logs/", JobLogConsumer.as_asgi()),
]
