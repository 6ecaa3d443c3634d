"""API errors as JSON: DRF's own handling, clear answers for bodies too big or too deeply nested
to read, and a 500 body that never shows a traceback."""

from __future__ import annotations

import logging

from django.core.exceptions import RequestDataTooBig
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

logger = logging.getLogger(__name__)


def exception_handler(exc, context):
    response = drf_exception_handler(exc, context)
    if response is not None:
        return response
    if isinstance(exc, RequestDataTooBig):
        return Response({"detail": "The request body is too large (at most 2.5 MB)."}, status=413)
    if isinstance(exc, RecursionError):
        return Response({"detail": "The request body is nested too deeply to read."}, status=400)
    logger.exception("unhandled API error in %s", context.get("view").__class__.__name__, exc_info=exc)
    return Response({"detail": "Internal error; the operators have the details in the server log."}, status=500)
