"""Projects in the API: each one's GPU quota and what it uses against it (members see their own
projects; staff see every one)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers, viewsets
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from jobs.models import Project
from jobs.services.quotas import ProjectUsage, project_usage


class ProjectUsageSerializer(serializers.Serializer):
    id = serializers.IntegerField(source="project.pk")
    name = serializers.CharField(source="project.name")
    gpu_quota = serializers.IntegerField(source="quota", help_text="GPUs guaranteed to the project.")
    gpu_borrow_limit = serializers.IntegerField(
        source="project.gpu_borrow_limit", allow_null=True, help_text="GPUs it may borrow beyond its quota; null: no limit."
    )
    gpus_used = serializers.IntegerField(source="used_gpus", help_text="GPUs its jobs hold now.")
    gpus_borrowed = serializers.IntegerField(source="borrowed", help_text="Of those, beyond its quota.")
    cpu_jobs = serializers.IntegerField(help_text="CPU-only jobs on nodes now.")
    cpu_job_limit = serializers.IntegerField()
    jobs_waiting = serializers.IntegerField(source="waiting_jobs")
    recent_gpus = serializers.FloatField(help_text="GPUs held on average lately (the decayed use fair share orders by).")
    summary = serializers.CharField(source="text", help_text='e.g. "using 6 of 8 GPUs; 2 borrowed"')


@extend_schema_view(
    list=extend_schema(summary="Your projects' quotas and usage", responses={200: ProjectUsageSerializer(many=True)}),
    retrieve=extend_schema(summary="A project's quota and usage", responses={200: ProjectUsageSerializer}),
)
@extend_schema(tags=["projects"])
class ProjectViewSet(viewsets.GenericViewSet):
    serializer_class = ProjectUsageSerializer
    permission_classes = [IsAuthenticated]
    pagination_class = None
    lookup_value_regex = r"[0-9]{1,18}"

    def get_queryset(self):
        return Project.objects.for_user(self.request.user).order_by("name")

    def list(self, request: Request) -> Response:
        return Response(ProjectUsageSerializer(project_usage(self.get_queryset()), many=True).data)

    def retrieve(self, request: Request, pk: str | None = None) -> Response:
        usage: list[ProjectUsage] = project_usage(Project.objects.filter(pk=self.get_object().pk))
        return Response(ProjectUsageSerializer(usage[0]).data)
