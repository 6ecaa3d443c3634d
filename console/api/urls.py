"""The REST API's routes, included at ``/api/v1/``."""

from __future__ import annotations

from django.urls import path
from rest_framework.routers import SimpleRouter

from console.api.jobs import NodeViewSet, TrainingJobViewSet
from console.api.projects import ProjectViewSet
from console.api.tokens import ObtainTokenView

router = SimpleRouter()
router.register("training-jobs", TrainingJobViewSet, basename="training-job")
router.register("nodes", NodeViewSet, basename="node")
router.register("projects", ProjectViewSet, basename="project")

urlpatterns = [
    path("auth/token/", ObtainTokenView.as_view(), name="api-token"),
    *router.urls,
]
