from __future__ import annotations

import time

from django.apps import AppConfig


class LogsConfig(AppConfig):
    name = "logs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at the top: the app registry is ready only now (Django's rule for ready()).
        from jobs import extensions

        extensions.on_control_round(purge_when_due)


_last_purge = 0.0


def purge_when_due() -> None:
    """Once an hour, delete log lines older than LOG_MAX_AGE_DAYS (0, the default, keeps all)."""
    global _last_purge
    from django.conf import settings

    from logs.services import purge_old_lines

    if settings.LOG_MAX_AGE_DAYS <= 0 or time.monotonic() - _last_purge < 3600:
        return
    _last_purge = time.monotonic()
    purge_old_lines(settings.LOG_MAX_AGE_DAYS)
