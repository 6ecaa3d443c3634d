"""The streamed download of a job's whole log stream, as plain text."""

from __future__ import annotations

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.views import APIView

from jobs.models import TrainingJob
from logs.queries import is_stream_name, stream_text


class LogDownloadView(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("stream", OpenApiTypes.STR, description="master (default) or worker-<n>")],
        responses={
            (200, "text/plain"): OpenApiResponse(OpenApiTypes.STR, description="the whole stream, one line per log line"),
            400: OpenApiResponse(description="bad stream name"),
            404: OpenApiResponse(description="no such job (or not yours)"),
        },
        summary="Download a job's log stream as text",
    )
    def get(self, request, pk: int):
        stream = request.query_params.get("stream", "master")
        if not is_stream_name(stream):
            raise ValidationError({"stream": "stream must be master or worker-<n>"})
        job = TrainingJob.objects.visible_to(request.user).filter(pk=pk).only("id", "name").first()
        if job is None:
            raise NotFound("No such training job.")
        response = StreamingHttpResponse(stream_text(job.pk, stream), content_type="text/plain; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="{job.name}-{stream}.log"'
        return response
