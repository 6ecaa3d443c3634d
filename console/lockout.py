"""Lock-out after repeated failed sign-ins, for the login page and the token endpoint alike.

Failures are counted in Django's cache over ``LOGIN_FAILURE_WINDOW`` seconds, twice: per username
(case-folded) and per client address. After ``LOGIN_FAILURE_LIMIT`` failures for one username it
is locked for the rest of the window, even with the right password, so guessing a password costs
hours, not seconds; after ``LOGIN_ADDRESS_FAILURE_LIMIT`` failures from one address, whatever the
usernames, that address is locked, so spraying one password across many usernames is slow too. A
success clears its username's count, never its address's (a valid account must not reset the
count of the guesses around it). Counts start again when the window ends.

The client address follows DRF's throttle rule (``REST_FRAMEWORK["NUM_PROXIES"]``): the peer's
address, or with proxies in front that many hops back in ``X-Forwarded-For``, never a header a
client can rotate at will.
"""

from __future__ import annotations

import hashlib
import logging

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest
from rest_framework.throttling import BaseThrottle

logger = logging.getLogger(__name__)

LOCKED_MESSAGE = "Too many failed sign-ins for this user: try again in {minutes} minutes."
ADDRESS_LOCKED_MESSAGE = "Too many failed sign-ins from your address: try again in {minutes} minutes."


def client_address(request: HttpRequest | None) -> str:
    """The client's address as the API's throttles key it ("" without a request)."""
    return (BaseThrottle().get_ident(request) or "") if request is not None else ""


def _key(kind: str, value: str) -> str:
    return f"login-failures:{kind}:" + hashlib.sha256(value.encode("utf-8", "replace")).hexdigest()


def _user_key(username: str) -> str:
    return _key("user", username.casefold())


def _address_key(address: str) -> str:
    return _key("address", address)


def _minutes() -> int:
    return max(1, round(settings.LOGIN_FAILURE_WINDOW / 60))


def refusal(username: str, address: str) -> str | None:
    """Why a sign-in is refused before its password is checked; None: check it."""
    if cache.get(_address_key(address), 0) >= settings.LOGIN_ADDRESS_FAILURE_LIMIT:
        return ADDRESS_LOCKED_MESSAGE.format(minutes=_minutes())
    if username and cache.get(_user_key(username), 0) >= settings.LOGIN_FAILURE_LIMIT:
        return LOCKED_MESSAGE.format(minutes=_minutes())
    return None


def _count(key: str) -> int:
    if cache.add(key, 1, timeout=settings.LOGIN_FAILURE_WINDOW):
        return 1
    try:
        return cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.add(key, 1, timeout=settings.LOGIN_FAILURE_WINDOW)
        return 1


def record_failure(username: str, address: str) -> None:
    if username and _count(_user_key(username)) == settings.LOGIN_FAILURE_LIMIT:
        logger.warning("sign-in for %r locked after %s failures", username[:150], settings.LOGIN_FAILURE_LIMIT)
    if _count(_address_key(address)) == settings.LOGIN_ADDRESS_FAILURE_LIMIT:
        logger.warning("sign-in from %s locked after %s failures", address[:100], settings.LOGIN_ADDRESS_FAILURE_LIMIT)


def record_success(username: str) -> None:
    cache.delete(_user_key(username))
