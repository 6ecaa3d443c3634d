"""Logging filters of the console (named in settings.LOGGING)."""

from __future__ import annotations

import logging


class ClientErrorsWithoutTraceback(logging.Filter):
    """A refused request (4xx: 403, 404 …) is the client's business: one line in the server log,
    not the traceback of the exception that produced the answer. Server errors keep theirs."""

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if isinstance(status, int) and status < 500:
            record.exc_info = None
            record.exc_text = None
        return True
