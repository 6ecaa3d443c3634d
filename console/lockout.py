"""Lock-out after repeated failed sign-ins, for the login page and the token endpoint alike.

Failures are counted per username (case-folded) in Django's cache over ``LOGIN_FAILURE_WINDOW``
seconds; after ``LOGIN_FAILURE_LIMIT`` of them the username is locked for the rest of the window,
even with the right password, so guessing a password costs hours, not seconds. The count starts
again after a success or when the window ends.
"""
from __future__ import annotations

import hashlib
import logging

from django.conf import settings
from django.core.cache import cache

logger = logging.getLogger(__name__)


def _key(username: str) -> str:
    return "login-failures:" + hashlib.sha256(username.casefold().encode("utf-8", "replace")).hexdigest()


def locked(username: str) -> bool:
    return cache.get(_key(username), 0) >= settings.LOGIN_FAILURE_LIMIT


def record_failure(username: str) -> None:
    key = _key(username)
    if cache.add(key, 1, timeout=settings.LOGIN_FAILURE_WINDOW):
        return
    try:
        count = cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.add(key, 1, timeout=settings.LOGIN_FAILURE_WINDOW)
        return
    if count == settings.LOGIN_FAILURE_LIMIT:
        logger.warning("sign-in for %r locked after %s failures", username[:150], count)


def record_success(username: str) -> None:
    cache.delete(_key(username))


LOCKED_MESSAGE = "Too many failed sign-ins for this user: try again in {minutes} minutes."


def locked_message() -> str:
    return LOCKED_MESSAGE.format(minutes=max(1, round(settings.LOGIN_FAILURE_WINDOW / 60)))
