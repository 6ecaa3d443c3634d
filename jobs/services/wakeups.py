"""Wake-ups of the embedded control round: it runs when something changed its answer, not on a clock.

In one process, the services that change the answer call ``round_wanted()``: a job created,
stopped, deleted or resumed, every status change the lifecycle writes but placement's own (an
attempt ended, a verdict, an image-pull back-off, a failover given up), a node cleared or its
Spot capacity reclaimed. After commit it raises the flag of each control loop of this process
(``subscribe``) and wakes it.

A process with no control loop (``manage.py inject_fault``, ``reclaim_spot``, ``job stop``, a node
agent without a broker) cannot reach the console's loop that way: it appends a byte to
``CONTROL_WAKE_FILE`` instead (``signal_other_processes``), and every agent loop without a broker
stats that file each ``CONTROL_WAKE_FILE_CHECK`` seconds (``FileWatch``: a stat, not a query); a
change makes the loop run a round and its agent reconcile.

Timed work (a retry time, a heartbeat going stale, a hold ending) is a deadline the round returns
(``jobs.services.control``), and a safety sweep every ``CONTROL_SWEEP_INTERVAL`` catches what no
wake-up names (an operator's edit in the admin, a write that failed halfway).

Scale-out uses none of the file: Celery beat runs the round every second and
``jobs.services.messages.request_placement`` sends one at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from django.conf import settings
from django.db import transaction

logger = logging.getLogger(__name__)

# The wake file is started afresh past this size (a byte per wake-up from another process).
WAKE_FILE_MAX_BYTES = 4096


class Subscription:
    """One control loop's flag: raised by ``round_wanted``, taken by the loop before its round."""

    def __init__(self, notify: Callable[[], None]) -> None:
        self.wanted = threading.Event()
        self.notify = notify

    def raise_flag(self) -> None:
        self.wanted.set()
        self.notify()

    def take(self) -> bool:
        """Whether a round was wanted since the last take (the flag is lowered)."""
        if not self.wanted.is_set():
            return False
        self.wanted.clear()
        return True

    def pending(self) -> bool:
        return self.wanted.is_set()


_lock = threading.Lock()
_subscriptions: list[Subscription] = []


def subscribe(notify: Callable[[], None]) -> Subscription:
    """A control loop of this process wants its rounds: ``notify`` wakes it (any thread)."""
    subscription = Subscription(notify)
    with _lock:
        _subscriptions.append(subscription)
    return subscription


def unsubscribe(subscription: Subscription) -> None:
    with _lock:
        if subscription in _subscriptions:
            _subscriptions.remove(subscription)


def has_control_loop() -> bool:
    with _lock:
        return bool(_subscriptions)


def round_wanted() -> None:
    """A control round should run now: after the current transaction commits (at once outside
    one; nothing if it rolls back). Never raises."""
    transaction.on_commit(_wake_rounds)


def _wake_rounds() -> None:
    with _lock:
        subscriptions = list(_subscriptions)
    for subscription in subscriptions:
        subscription.raise_flag()
    if not subscriptions:
        signal_other_processes()


def signal_other_processes() -> None:
    """Tell the console's loop in another process that something changed: a byte appended to the
    wake file (embedded default only; scale-out sends messages). A failure is logged: the safety
    sweep catches the change."""
    if settings.SCALE_OUT:
        return
    path = Path(settings.CONTROL_WAKE_FILE)
    global _own_state
    try:
        try:
            fresh = path.stat().st_size >= WAKE_FILE_MAX_BYTES
        except FileNotFoundError:
            fresh = False
        if fresh:
            spare = path.with_name(f".{path.name}.{os.getpid()}")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(spare)
            append_byte(spare, os.O_EXCL)
            os.replace(spare, path)
        else:
            append_byte(path)
        _own_state = file_state(path)
    except FileNotFoundError:
        logger.debug("no %s: no console has run here yet", path.parent)
    except OSError as exc:
        logger.warning("could not signal the control loop through %s (%s); its safety sweep will see the change", path, exc)


def append_byte(path: Path, extra_flags: int = 0) -> None:
    """One byte at the end of ``path`` (made 0600 if missing), never through a symbolic link: a
    process of root's must not write where a link someone planted points."""
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | extra_flags, 0o600)
    try:
        os.write(descriptor, b".")
    finally:
        os.close(descriptor)


def file_state(path: Path) -> tuple[int, int, int] | None:
    """What tells one write of the wake file from the next: inode (a fresh file), size (one byte
    a write) and modification time."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


# The wake file as this process last left it: its own signals never wake its own loops.
_own_state: tuple[int, int, int] | None = None


class FileWatch:
    """A loop's watch on the wake file: ``changed()`` stats it when a check is due."""

    def __init__(self, path: Path | None = None, *, every: float | None = None) -> None:
        self.path = Path(settings.CONTROL_WAKE_FILE if path is None else path)
        self.every = settings.CONTROL_WAKE_FILE_CHECK if every is None else every
        self.seen = file_state(self.path)
        self.next_check = time.monotonic() + self.every

    def due_in(self) -> float:
        return max(0.0, self.next_check - time.monotonic())

    def changed(self) -> bool:
        """Whether another process wrote the file since the last check (checked when due)."""
        now = time.monotonic()
        if now < self.next_check:
            return False
        self.next_check = now + self.every
        state = file_state(self.path)
        changed = state != self.seen and state != _own_state
        self.seen = state
        return changed
