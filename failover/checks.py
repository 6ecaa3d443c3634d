"""System checks of the failover settings."""
from __future__ import annotations

from django.conf import settings
from django.core.checks import Warning, register


@register()
def heartbeat_outlasts_database_locks(app_configs, **kwargs) -> list:
    """A heartbeat held up by a database lock must not make a node lost: the heartbeat timeout
    has to be well above (2×) the database's busy timeout."""
    busy = settings.DATABASES["default"].get("OPTIONS", {}).get("timeout")
    if busy is None or settings.NODE_HEARTBEAT_TIMEOUT >= 2 * float(busy):
        return []
    return [
        Warning(
            f"NODE_HEARTBEAT_TIMEOUT ({settings.NODE_HEARTBEAT_TIMEOUT:.0f}s) is not well above the database busy "
            f"timeout ({busy}s): one long lock can make healthy nodes lost and fail their jobs over.",
            hint=f"Set NODE_HEARTBEAT_TIMEOUT to at least {2 * float(busy):.0f}.",
            id="failover.W001",
        )
    ]
