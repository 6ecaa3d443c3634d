"""The REST API: Training Jobs (list, create, stop, clone, delete; events, attempts, logs), GPU
nodes for operators, and a token for scripts.

Views parse input, call one service and return. A job the user may not see is a 404, whatever
the action; a user action the job's status refuses is a 409 with the service's message.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from django.db import IntegrityError
from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response

from agent.resume import resumable_step
from console.api.serializers import (
    MAX_DB_INT,
    ORDERINGS,
    CloneRequestSerializer,
    ErrorSerializer,
    JobAttemptSerializer,
    JobEventSerializer,
    JobListQuerySerializer,
    LogPageSerializer,
    LogQuerySerializer,
    NodeSerializer,
    ResourceSampleSerializer,
    TrainingJobSerializer,
)
from console.estimate import estimates_for
from console.paging import ListBranches, capped_count, list_branches, rows_between
from jobs.models import Node, TrainingJob
from jobs.rest import JSONParser
from jobs.services.actions import JobActionRefused, delete_job, request_stop, resume_job
from jobs.services.creation import JobRefused, JobSettingsRefused, clone_job, create_job
from jobs.services.nodes import set_cordoned
from jobs.services.samples import samples_of
from jobs.statuses import JobStatus
from logs.queries import read_log_page

logger = logging.getLogger(__name__)

INTEGER_ID = re.compile(r"[0-9]{1,19}")
NODE_KEY = re.compile(r"[a-z0-9][-a-z0-9]{0,62}")

FIELD_ERRORS = OpenApiResponse(OpenApiTypes.OBJECT, description="Invalid input: {field: [message, …]}.")
JOB_NOT_FOUND = OpenApiResponse(ErrorSerializer, description="No such job, or you may not see it.")
NODE_NOT_FOUND = OpenApiResponse(ErrorSerializer, description="No such node.")
STAFF_ONLY = OpenApiResponse(ErrorSerializer, description="Only staff may see and manage nodes.")


def conflict(exc: JobActionRefused) -> Response:
    return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)


def name_taken(name: str | None) -> serializers.ValidationError:
    return serializers.ValidationError({"name": [f"You already have a job named {name}."]})


def refused(exc: JobRefused) -> serializers.ValidationError:
    """A 400 for a job the creation service refused: settings on their fields, the queue's limit as ``detail``."""
    if isinstance(exc, JobSettingsRefused):
        return serializers.ValidationError(exc.problems)
    return serializers.ValidationError({"detail": str(exc)})


class ApiPagination(LimitOffsetPagination):
    # A cap keeps ``limit`` inside what the database accepts (and pages a sane size).
    max_limit = 500

    def get_count(self, queryset) -> int:
        # Exact up to 10,000; 10,001 means more (a COUNT over a whole large table costs it all).
        return capped_count(queryset, self.branches.counts)

    def paginate_queryset(self, queryset, request, view=None):
        # DRF's, but the page is read from each access branch's first rows (console.paging).
        self.request = request
        self.branches: ListBranches = getattr(view, "list_branches", None) or ListBranches()
        self.limit = self.get_limit(request)
        if self.limit is None:
            return None
        self.count = self.get_count(queryset)
        self.offset = self.get_offset(request)
        if self.count > self.limit and self.template is not None:
            self.display_page_controls = True
        if self.count == 0 or self.offset > self.count:
            return []
        return list(rows_between(queryset, self.branches.rows, self.offset, self.offset + self.limit, product=self.branches.product))


JOB_ID = OpenApiParameter("id", int, OpenApiParameter.PATH, description="The job's id.")
STATUS_FILTER = OpenApiParameter(
    "status",
    {"type": "array", "items": {"type": "string", "enum": list(JobStatus.values)}},
    description="Exact status text; repeat the parameter or separate values with commas.",
    explode=True,
)


@extend_schema_view(
    list=extend_schema(
        summary="List the jobs you may see",
        parameters=[
            STATUS_FILTER,
            OpenApiParameter("job_type", str, enum=list(TrainingJob.JobType.values)),
            OpenApiParameter("search", str, description="Part of the job's name (any case)."),
            OpenApiParameter("ordering", str, enum=list(ORDERINGS), description="Default -created_at."),
        ],
        responses={200: TrainingJobSerializer(many=True), 400: FIELD_ERRORS},
    ),
    create=extend_schema(
        summary="Create a job",
        description="The job starts Pending. An image the console does not know is accepted; the job then waits in `Pending - imagepullbackoff`.",
        responses={201: TrainingJobSerializer, 400: FIELD_ERRORS},
        examples=[
            OpenApiExample(
                "A two-GPU fine-tune",
                request_only=True,
                value={
                    "name": "bert-finetune",
                    "job_type": "On-Demand",
                    "image": "pytorch:2.13-py3.11",
                    "command": 'PYTHONPATH=$CHECKPOINT_VENDOR HF_DATASETS_OFFLINE="1" deepspeed --num_gpus=2 train.py',
                    "env": {"EPOCHS": "3"},
                    "gpus_per_node": 2,
                    "node_count": 1,
                    "failover_enabled": True,
                    "output_dir": "/data/bert",
                },
            )
        ],
    ),
    retrieve=extend_schema(summary="A job", parameters=[JOB_ID], responses={200: TrainingJobSerializer, 404: JOB_NOT_FOUND}),
    destroy=extend_schema(
        summary="Delete a finished job",
        parameters=[JOB_ID],
        responses={
            204: None,
            404: JOB_NOT_FOUND,
            409: OpenApiResponse(ErrorSerializer, description="The job is still active; stop it first."),
        },
    ),
)
@extend_schema(tags=["training-jobs"])
class TrainingJobViewSet(
    mixins.ListModelMixin,
    mixins.CreateModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    serializer_class = TrainingJobSerializer
    pagination_class = ApiPagination
    # Jobs carry nested values (env), so the API takes JSON bodies only.
    parser_classes = [JSONParser]
    # Anything up to the next slash reaches get_object, which answers a bad id with a JSON 404.
    lookup_value_regex = r"[^/]+"
    queryset = TrainingJob.objects.none()  # for the schema; get_queryset scopes it to the user

    def get_queryset(self) -> QuerySet[TrainingJob]:
        # with_run_time: running_time_seconds without a query per job of a listed page.
        return TrainingJob.objects.visible_to(self.request.user).select_related("owner", "project").with_run_time()

    def paginate_queryset(self, queryset: QuerySet[TrainingJob]) -> list[TrainingJob] | None:
        page = super().paginate_queryset(queryset)
        if page is not None:
            # The waiting jobs' start estimates, the GPUs read once for the page.
            self.queue_estimates = estimates_for(list(page))
        return page

    def get_serializer_context(self) -> dict[str, Any]:
        context = super().get_serializer_context()
        if hasattr(self, "queue_estimates"):
            context["queue_estimates"] = self.queue_estimates
        return context

    def get_object(self) -> TrainingJob:
        raw = str(self.kwargs[self.lookup_url_kwarg or self.lookup_field])
        job = None
        if INTEGER_ID.fullmatch(raw) and int(raw) <= MAX_DB_INT:
            job = self.get_queryset().filter(pk=int(raw)).first()
        if job is None:
            raise NotFound("No such training job, or you may not see it.")
        self.check_object_permissions(self.request, job)
        return job

    def filter_queryset(self, queryset: QuerySet[TrainingJob]) -> QuerySet[TrainingJob]:
        if self.action != "list":
            return queryset
        params = self.request.query_params
        statuses = [part.strip() for raw in params.getlist("status") for part in raw.split(",") if part.strip()]
        query = JobListQuerySerializer(data={"status": statuses, **{k: params[k] for k in ("job_type", "search", "ordering") if params.get(k)}})
        query.is_valid(raise_exception=True)
        wanted = query.validated_data
        if wanted.get("status"):
            queryset = queryset.filter(status__in=wanted["status"])
        self.list_branches = list_branches(self.request.user, wanted.get("status") or ())
        if wanted.get("job_type"):
            queryset = queryset.filter(job_type=wanted["job_type"])
        if wanted.get("search"):
            queryset = queryset.filter(name__icontains=wanted["search"])
        return queryset.order_by(wanted["ordering"], "-id")

    def perform_create(self, serializer: TrainingJobSerializer) -> None:
        user = self.request.user
        try:
            serializer.instance = create_job(owner=user, actor=user.get_username(), **serializer.validated_data)
        except IntegrityError:  # a concurrent create took the name after validation
            raise name_taken(serializer.validated_data.get("name")) from None
        except JobRefused as exc:
            raise refused(exc) from None

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        job = self.get_object()
        try:
            delete_job(job)
        except JobActionRefused as exc:
            return conflict(exc)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        summary="Stop a job",
        parameters=[JOB_ID],
        description="A job without a process is Stopped at once; a Running one goes to Stopping.",
        request=None,
        responses={
            200: TrainingJobSerializer,
            404: JOB_NOT_FOUND,
            409: OpenApiResponse(ErrorSerializer, description="The job's status does not allow stopping."),
        },
    )
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        try:
            request_stop(job, actor=request.user.get_username())
        except JobActionRefused as exc:
            return conflict(exc)
        return Response(self.get_serializer(self.get_object()).data)

    @extend_schema(
        summary="Resume a job from its last checkpoint",
        parameters=[JOB_ID],
        description="A Stopped or `Pending - internalerror` job with a committed checkpoint goes back to Pending; "
        "its next attempt starts with `CKPT_LAST_STEP` (the newest committed checkpoint in its work or output directory).",
        request=None,
        responses={
            200: TrainingJobSerializer,
            404: JOB_NOT_FOUND,
            409: OpenApiResponse(
                ErrorSerializer,
                description="Not Stopped / internalerror, no committed checkpoint, or settings a new job may not have now "
                "(e.g. its project no longer allows a multi-node job's network).",
            ),
        },
    )
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        try:
            resume_job(job, actor=request.user.get_username(), checkpoint_step=resumable_step(job))
        except JobActionRefused as exc:
            return conflict(exc)
        return Response(self.get_serializer(self.get_object()).data)

    @extend_schema(
        summary="Clone a job",
        parameters=[JOB_ID],
        description="A new Pending job with the same settings, owned by you; named <name>-copy unless given. "
        "Settings a new job may not have now (e.g. a multi-node job in a project that no longer allows its network) "
        "are a 400 on their fields.",
        request=CloneRequestSerializer,
        responses={201: TrainingJobSerializer, 400: FIELD_ERRORS, 404: JOB_NOT_FOUND},
    )
    @action(detail=True, methods=["post"])
    def clone(self, request: Request, pk: str | None = None) -> Response:
        source = self.get_object()
        body = CloneRequestSerializer(data=request.data, context=self.get_serializer_context())
        body.is_valid(raise_exception=True)
        name = body.validated_data.get("name")
        try:
            job = clone_job(source, owner=request.user, name=name)
        except IntegrityError:
            raise name_taken(name) from None
        except JobRefused as exc:
            raise refused(exc) from None
        return Response(self.get_serializer(job).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        summary="A job's status history",
        parameters=[JOB_ID],
        responses={200: JobEventSerializer(many=True), 404: JOB_NOT_FOUND},
    )
    @action(detail=True, methods=["get"], pagination_class=None)
    def events(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        return Response(JobEventSerializer(job.events.order_by("created_at", "id"), many=True).data)

    @extend_schema(
        summary="A job's attempts: where each ran and how it ended",
        parameters=[JOB_ID],
        responses={200: JobAttemptSerializer(many=True), 404: JOB_NOT_FOUND},
    )
    @action(detail=True, methods=["get"], pagination_class=None)
    def attempts(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        attempts = job.attempts.order_by("number").prefetch_related("placements__node")
        return Response(JobAttemptSerializer(attempts, many=True).data)

    @extend_schema(
        summary="A job's GPU and host usage over time",
        description="Samples the node agent took of the job's runs, oldest first: GPU utilisation (mean, %), "
        "GPU memory (MiB) and power (W) summed over the job's GPUs, host CPU (% of one core) and memory (MiB) "
        "of its processes. Older samples are merged (their `span_s` grows), so a long job keeps a few hundred. "
        "Simulated GPUs give synthetic readings.",
        parameters=[JOB_ID],
        responses={200: ResourceSampleSerializer(many=True), 404: JOB_NOT_FOUND},
    )
    @action(detail=True, methods=["get"], pagination_class=None)
    def metrics(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        return Response(ResourceSampleSerializer(samples_of(job.pk), many=True).data)

    @extend_schema(
        summary="A range of a job's log",
        description="Forward from `after` (up to `before`), or with `before` alone the last `limit` lines "
        "before it; lines are always in ascending `seq` order.",
        parameters=[JOB_ID, LogQuerySerializer],
        responses={200: LogPageSerializer, 400: FIELD_ERRORS, 404: JOB_NOT_FOUND},
    )
    @action(detail=True, methods=["get"], pagination_class=None)
    def logs(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        query = LogQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        return Response(LogPageSerializer(read_log_page(job.pk, **query.validated_data)).data)


NODE_KEY_PARAMETER = OpenApiParameter("name", str, OpenApiParameter.PATH, description="The node's name or id.")


@extend_schema_view(
    list=extend_schema(summary="GPU nodes (staff)", responses={200: NodeSerializer(many=True), 403: STAFF_ONLY}),
    retrieve=extend_schema(
        summary="A GPU node (staff)",
        parameters=[NODE_KEY_PARAMETER],
        responses={200: NodeSerializer, 403: STAFF_ONLY, 404: NODE_NOT_FOUND},
    ),
)
@extend_schema(tags=["nodes"])
class NodeViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = NodeSerializer
    permission_classes = [IsAdminUser]
    pagination_class = ApiPagination
    lookup_field = "name"
    lookup_value_regex = r"[^/]+"
    queryset = Node.objects.prefetch_related("gpus").order_by("name")

    def get_object(self) -> Node:
        key = str(self.kwargs["name"])
        nodes = self.get_queryset()
        node = nodes.filter(name=key).first() if NODE_KEY.fullmatch(key) else None
        if node is None and INTEGER_ID.fullmatch(key) and int(key) <= MAX_DB_INT:
            node = nodes.filter(pk=int(key)).first()
        if node is None:
            raise NotFound("No such node.")
        self.check_object_permissions(self.request, node)
        return node

    def set_cordoned(self, request: Request, cordoned: bool) -> Response:
        set_cordoned(self.get_object(), cordoned, actor=request.user.get_username())
        return Response(self.get_serializer(self.get_object()).data)

    @extend_schema(
        summary="Cordon a node: place no new jobs on it (staff)",
        request=None,
        parameters=[NODE_KEY_PARAMETER],
        responses={200: NodeSerializer, 403: STAFF_ONLY, 404: NODE_NOT_FOUND},
    )
    @action(detail=True, methods=["post"])
    def cordon(self, request: Request, name: str | None = None) -> Response:
        return self.set_cordoned(request, True)

    @extend_schema(
        summary="Uncordon a node (staff)",
        request=None,
        parameters=[NODE_KEY_PARAMETER],
        responses={200: NodeSerializer, 403: STAFF_ONLY, 404: NODE_NOT_FOUND},
    )
    @action(detail=True, methods=["post"])
    def uncordon(self, request: Request, name: str | None = None) -> Response:
        return self.set_cordoned(request, False)
