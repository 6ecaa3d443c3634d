"""A job's results and its users' code in the API: code bundles (upload, list), and what a job
wrote (its output and work directories, its committed checkpoints), listed with sizes and
downloaded as a file or a streamed tar (``agent.outputs``).

A job or a bundle its user may not see is a 404, as everywhere in the API.
"""

from __future__ import annotations

from typing import Any

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.exceptions import NotFound
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agent import outputs
from jobs.models import CodeBundle, Project, TrainingJob
from jobs.services.bundles import BundleRefused, store_upload, usable_by
from jobs.services.creation import personal_project_for


class CodeBundleSerializer(serializers.ModelSerializer):
    project_name = serializers.CharField(source="project.name", read_only=True)
    owner = serializers.CharField(source="owner.username", read_only=True)

    class Meta:
        model = CodeBundle
        fields = ["id", "project", "project_name", "owner", "sha256", "size", "unpacked_size", "files", "source", "created_at"]
        read_only_fields = fields


class BundleUploadSerializer(serializers.Serializer):
    archive = serializers.FileField(help_text="A .tar, .tar.gz or .zip of the directory (satrain jobs create --code DIR packs one).")
    project = serializers.PrimaryKeyRelatedField(
        queryset=Project.objects.none(),
        required=False,
        allow_null=True,
        help_text="The project whose jobs may use it; defaults to your personal project.",
        error_messages={"does_not_exist": "Project {pk_value} does not exist or you are not a member of it."},
    )

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        request = self.context.get("request")
        if request is not None and request.user.is_authenticated:
            fields["project"].queryset = Project.objects.for_user(request.user)
        return fields


def upload_bundle(request: Request, archive: Any, project: Project | None) -> CodeBundle:
    """Keep an uploaded archive as a bundle; a ValidationError on ``archive`` says why not."""
    try:
        return store_upload(archive, owner=request.user, project=project or personal_project_for(request.user))
    except BundleRefused as exc:
        raise serializers.ValidationError({"archive": [str(exc)]}) from None


@extend_schema(tags=["code-bundles"])
class CodeBundleViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Code bundles: a directory packed once, which jobs of its project run in (``code``)."""

    serializer_class = CodeBundleSerializer
    parser_classes = [MultiPartParser]
    lookup_value_regex = r"[0-9]{1,18}"

    def get_queryset(self):
        return usable_by(self.request.user).select_related("project", "owner").order_by("-created_at", "-id")

    @extend_schema(
        summary="Upload a code bundle",
        request={"multipart/form-data": BundleUploadSerializer},
        responses={201: CodeBundleSerializer, 400: OpenApiResponse(OpenApiTypes.OBJECT, description="{archive: [why]}")},
    )
    def create(self, request: Request) -> Response:
        body = BundleUploadSerializer(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        bundle = upload_bundle(request, body.validated_data["archive"], body.validated_data.get("project"))
        return Response(CodeBundleSerializer(bundle).data, status=status.HTTP_201_CREATED)


def job_for(request: Request, pk: str) -> TrainingJob:
    job = TrainingJob.objects.visible_to(request.user).filter(pk=pk).first()
    if job is None:
        raise NotFound("No such job, or you may not see it.")
    return job


def refused(exc: outputs.OutputRefused) -> Response:
    code = status.HTTP_400_BAD_REQUEST if isinstance(exc, outputs.BadPath) else status.HTTP_404_NOT_FOUND
    return Response({"detail": str(exc)}, status=code)


def outputs_of(job: TrainingJob, *, trees: bool = True) -> dict[str, Any]:
    """The job's directories with their entries (``trees``), and its checkpoints: what the page
    and the API show."""
    listed: dict[str, Any] = {}
    for name in outputs.TREES if trees else ():
        try:
            tree, entries, more = outputs.listing(job, name)
        except outputs.OutputRefused as exc:
            listed[name] = {"path": "", "entries": [], "truncated": False, "total_bytes": 0, "problem": str(exc)}
            continue
        listed[name] = {
            "path": tree.in_run,
            "entries": [{"path": e.path, "kind": e.kind, "size": e.size} for e in entries],
            "truncated": more,
            "total_bytes": sum(e.size for e in entries),
        }
    steps = [
        {"step": row.step, "tree": f"checkpoint-{row.step}", "attempt": row.attempt, "bytes": row.bytes, "path": row.path, "available": there}
        for row, there in outputs.checkpoints_on_disk(job)
    ]
    return {"trees": listed, "checkpoints": steps}


SHOWN_DEPTH = 2  # the page lists entries this deep; a folder there says what it holds


def folded(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The page's rows: entries at most SHOWN_DEPTH deep, each folder with the files and bytes
    below it (a checkpoint is one row, downloaded as one .tar)."""
    rows = [dict(e, files=0) for e in entries if e["path"].count("/") < SHOWN_DEPTH]
    folders = {row["path"]: row for row in rows if row["kind"] == "directory"}
    for entry in entries:
        if entry["kind"] != "file":
            continue
        parts = entry["path"].split("/")
        for depth in range(1, min(len(parts), SHOWN_DEPTH + 1)):
            folder = folders.get("/".join(parts[:depth]))
            if folder is not None:
                folder["files"] += 1
                folder["size"] += entry["size"]
    return rows


JOB_ID = OpenApiParameter("id", int, OpenApiParameter.PATH, description="The job's id.")


class JobOutputsView(APIView):
    @extend_schema(
        summary="What a job wrote: its output and work directories and its checkpoints, with sizes",
        parameters=[JOB_ID],
        responses={200: OpenApiTypes.OBJECT, 400: OpenApiTypes.OBJECT, 404: OpenApiTypes.OBJECT},
        tags=["training-jobs"],
    )
    def get(self, request: Request, pk: str) -> Response:
        return Response(outputs_of(job_for(request, pk)))


def download_response(job: TrainingJob, tree: str, path: str) -> StreamingHttpResponse:
    """A file of the tree as itself, a directory (or the whole tree) as a tar; OutputRefused otherwise."""
    opened = outputs.open_file(job, tree, path)
    if opened is not None:
        handle, size, name = opened
        response = StreamingHttpResponse(outputs.file_chunks(handle), content_type="application/octet-stream")
        response["Content-Length"] = str(size)
    else:
        name, stream = outputs.archive(job, tree, path)
        response = StreamingHttpResponse(stream, content_type="application/x-tar")
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:120] or "download"
    response["Content-Disposition"] = f'attachment; filename="{safe}"'
    response["X-Content-Type-Options"] = "nosniff"
    return response


class JobDownloadView(APIView):
    @extend_schema(
        summary="Download a file, a directory or a checkpoint a job wrote",
        parameters=[
            JOB_ID,
            OpenApiParameter("tree", str, OpenApiParameter.PATH, description="output, work or checkpoint-<step>"),
            OpenApiParameter("path", str, description="A file or directory below it; empty: all of it (a tar)."),
        ],
        responses={(200, "application/octet-stream"): OpenApiTypes.BINARY, 400: OpenApiTypes.OBJECT, 404: OpenApiTypes.OBJECT},
        tags=["training-jobs"],
    )
    def get(self, request: Request, pk: str, tree: str) -> Any:
        job = job_for(request, pk)
        try:
            return download_response(job, tree, request.query_params.get("path", ""))
        except outputs.OutputRefused as exc:
            return refused(exc)
