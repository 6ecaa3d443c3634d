"""System checks of the failover settings: the lost-node lease, per mode."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Warning, register

# Below this a node is lost after one slow round of its agent (a large output drain, a slow
# reconcile) on top of the beats a short network hiccup costs: healthy nodes fail their jobs over.
SCALE_OUT_MIN_TIMEOUT = 5.0


@register()
def heartbeat_outlasts_database_locks(app_configs, **kwargs) -> list:
    """A heartbeat held up by a database lock must not make a node lost.

    With SQLite (embedded, or Redis beside SQLite) the agent's loop may wait out SQLite's busy
    timeout between two beats: the heartbeat timeout has to be well above (2×) it. On PostgreSQL
    with Redis the beat is a Redis write every ``timeout / 6``, held up by no database lock: what
    matters is that a few beats and one slow agent round fit in the lease.
    """
    timeout = settings.NODE_HEARTBEAT_TIMEOUT
    busy = settings.DATABASES["default"].get("OPTIONS", {}).get("timeout")
    if busy is not None and timeout < 2 * float(busy):
        return [
            Warning(
                f"NODE_HEARTBEAT_TIMEOUT ({timeout:g}s) is not well above the database busy timeout ({busy}s): one long "
                "lock can make healthy nodes lost and fail their jobs over.",
                hint=f"Set NODE_HEARTBEAT_TIMEOUT to at least {2 * float(busy):g}, or run on PostgreSQL with Redis "
                "(docs/deployment.md), where the beat goes to Redis and a short lease is safe.",
                id="failover.W001",
            )
        ]
    if busy is None and settings.SCALE_OUT and timeout < SCALE_OUT_MIN_TIMEOUT:
        return [
            Warning(
                f"NODE_HEARTBEAT_TIMEOUT ({timeout:g}s) is below {SCALE_OUT_MIN_TIMEOUT:g}s: one slow agent round can make "
                "a healthy node lost and fail its jobs over.",
                hint=f"Set NODE_HEARTBEAT_TIMEOUT to at least {SCALE_OUT_MIN_TIMEOUT:g} (the scale-out default is 12).",
                id="failover.W002",
            )
        ]
    return []
