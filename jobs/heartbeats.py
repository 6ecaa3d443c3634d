"""Node heartbeats in scale-out: one Redis write per beat instead of a database row update.

Agents ``beat`` (``ZADD node-heartbeats <unix time> <node>``, and in the same round trip
``SREM node-heartbeats:lost <node>``, which tells an agent whose node the control plane took as
lost that it must come back as Ready). The lost-node sweep asks Redis only for the stale names
(``ZRANGEBYSCORE``), so its cost does not grow with the fleet. The database's
``Node.last_heartbeat`` is still written by the agent every ``NODE_HEARTBEAT_DB_INTERVAL`` (and on
a state change), so the admin and ``/metrics`` stay roughly true and a Redis flush is survivable:
the sweep takes the newer of the two, and a node with no beat in Redis at all is judged by the
database's beat against ``db_deadline`` (the short lease is Redis's alone).

An agent restarting never clears its beat (nothing here deletes a score), and the sweep notes a
mass heartbeat loss (``note_outage``) so that nodes get a fresh full timeout once beats resume.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.conf import settings

BEATS = "node-heartbeats"
LOST = "node-heartbeats:lost"
OUTAGE = "node-heartbeats:outage"


def beat_interval() -> float:
    """Six beats per timeout (2 s at scale-out's 12 s), at most every 5 s: a node is lost only
    after several beats in a row went missing, never for one late or dropped beat. Agents beat a
    little early at random (``NodeAgent.heartbeat``), so a fleet restarted at once spreads out."""
    return min(5.0, settings.NODE_HEARTBEAT_TIMEOUT / 6)


def db_deadline(now: float) -> float:
    """Unix time before which a node's database beat alone makes it lost (scale-out, a node with
    no beat in Redis, e.g. after a flush): that beat is written only every
    ``NODE_HEARTBEAT_DB_INTERVAL``, so it gets that long on top of the timeout."""
    return now - settings.NODE_HEARTBEAT_DB_INTERVAL - settings.NODE_HEARTBEAT_TIMEOUT


def client():
    from jobs.services.messages import redis_client

    return redis_client()


def beat(names: Iterable[str], at: float) -> set[str]:
    """Record a beat of ``names`` at unix time ``at``; returns those the sweep had marked lost."""
    names = list(names)
    if not names:
        return set()
    pipe = client().pipeline(transaction=False)
    pipe.zadd(BEATS, {name: at for name in names})
    for name in names:
        pipe.srem(LOST, name)
    results = pipe.execute()
    return {name for name, removed in zip(names, results[1:], strict=True) if removed}


def stale(before: float) -> dict[str, float]:
    """The nodes whose last beat in Redis is older than unix time ``before``, with that time."""
    return {_name(n): float(s) for n, s in client().zrangebyscore(BEATS, "-inf", f"({before}", withscores=True)}


def scores(names: list[str]) -> dict[str, float]:
    """The last beat in Redis of each of ``names`` that has one."""
    if not names:
        return {}
    return {n: float(s) for n, s in zip(names, client().zmscore(BEATS, names), strict=True) if s is not None}


def mark_lost(names: Iterable[str]) -> None:
    names = list(names)
    if names:
        client().sadd(LOST, *names)


def note_outage(at: float, *, keep_for: float) -> None:
    client().set(OUTAGE, repr(at), ex=max(1, int(keep_for) + 1))


def last_outage() -> float | None:
    value = client().get(OUTAGE)
    return float(value) if value else None


def _name(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
