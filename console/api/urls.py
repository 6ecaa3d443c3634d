"""The REST API's routes, included at ``/api/v1/``."""

from __future__ import annotations

from django.urls import path, re_path
from rest_framework.routers import SimpleRouter

from console.api.jobs import NodeViewSet, TrainingJobViewSet
from console.api.outputs import CodeBundleViewSet, JobDownloadView, JobOutputsView
from console.api.projects import ProjectViewSet
from console.api.tokens import ObtainTokenView

router = SimpleRouter()
router.register("training-jobs", TrainingJobViewSet, basename="training-job")
router.register("nodes", NodeViewSet, basename="node")
router.register("projects", ProjectViewSet, basename="project")
router.register("code-bundles", CodeBundleViewSet, basename="code-bundle")

urlpatterns = [
    path("auth/token/", ObtainTokenView.as_view(), name="api-token"),
    re_path(r"^training-jobs/(?P<pk>[0-9]{1,18})/outputs/$", JobOutputsView.as_view(), name="training-job-outputs"),
    re_path(r"^training-jobs/(?P<pk>[0-9]{1,18})/outputs/(?P<tree>[a-z0-9-]{1,40})/download/$", JobDownloadView.as_view(), name="training-job-download"),
    *router.urls,
]
