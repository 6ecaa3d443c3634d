"""Secret environment variables: stored encrypted, shown as ``••••`` everywhere, revealed only to
the run's environment.

The key is derived from the console's ``SECRET_KEY`` (HKDF-SHA256, its own ``info``), so it is
exactly as readable as that key: by the console's processes (and the node agents that share its
settings), never by a job, whose container sees nothing of the host's filesystem. Rotating the
``SECRET_KEY`` keeps old values readable while the old key is in ``SECRET_KEY_FALLBACKS``; new
values are encrypted with the current key.

A stored value is JSON ``{"names": [...], "token": "<Fernet token>"}``: the names stay readable
without the key (the pages list them), the values only with it. ``SecretEnv`` holds one job's
secrets; its ``repr``/``str`` never show a value, so a stray log call or traceback cannot either.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.db import models

MASK = "••••"
# Names that are secret wherever they are written (the form's plain field, the API's ``env``).
SECRET_NAME = re.compile(r"(^|_)(TOKEN|KEY|PASSWORD|SECRET)$")


class SecretUnreadable(Exception):
    """Stored secrets the console's key cannot decrypt (the SECRET_KEY changed without a fallback)."""


def is_secret_name(name: str) -> bool:
    """Whether ``name`` is secret by default (``HF_TOKEN``, ``WANDB_API_KEY``, ``DB_PASSWORD``, …)."""
    return bool(SECRET_NAME.search(name.upper()))


@lru_cache(maxsize=8)
def _fernet_for(secret_key: str) -> Fernet:
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"satrain secret environment variables v1").derive(secret_key.encode())
    return Fernet(base64.urlsafe_b64encode(derived))


def _fernet() -> MultiFernet:
    keys = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
    return MultiFernet([_fernet_for(key) for key in keys])


class SecretEnv:
    """One job's secret variables: their names, and their values behind ``reveal()``."""

    __slots__ = ("_names", "_plain", "_token")

    def __init__(self, names: Iterable[str] = (), *, token: str = "", plain: Mapping[str, str] | None = None) -> None:
        self._plain = dict(plain) if plain is not None else None
        self._names = tuple(self._plain) if self._plain is not None else tuple(names)
        self._token = token

    @classmethod
    def of(cls, values: Mapping[str, str]) -> SecretEnv:
        return cls(plain=values)

    @classmethod
    def from_stored(cls, stored: str | None) -> SecretEnv:
        if not stored:
            return cls()
        try:
            record = json.loads(stored)
            names = [str(name) for name in record["names"]]
            token = str(record["token"])
        except (ValueError, KeyError, TypeError):
            raise SecretUnreadable("the stored secret variables are not in the expected form") from None
        return cls(names, token=token)

    def stored(self) -> str:
        """The column's text: names in the clear, values encrypted."""
        if not self._names:
            return ""
        if self._plain is None:
            return json.dumps({"names": list(self._names), "token": self._token})
        token = _fernet().encrypt(json.dumps(self._plain).encode()).decode()
        return json.dumps({"names": list(self._names), "token": token})

    @property
    def names(self) -> tuple[str, ...]:
        return self._names

    def masked(self) -> dict[str, str]:
        return {name: MASK for name in self._names}

    def reveal(self) -> dict[str, str]:
        """The values, for the run's environment only; raises SecretUnreadable."""
        if self._plain is not None:
            return dict(self._plain)
        if not self._names:
            return {}
        try:
            values = json.loads(_fernet().decrypt(self._token.encode()))
        except (InvalidToken, ValueError):
            raise SecretUnreadable(
                "the job's secret variables cannot be decrypted with the console's SECRET_KEY (it changed; put the old one in SECRET_KEY_FALLBACKS)"
            ) from None
        if not isinstance(values, dict):
            raise SecretUnreadable("the stored secret variables are not in the expected form")
        return {str(name): str(value) for name, value in values.items()}

    def __bool__(self) -> bool:
        return bool(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SecretEnv):
            return self.reveal() == other.reveal()
        if isinstance(other, Mapping):
            return self.reveal() == dict(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-looking value, compared by content

    def __repr__(self) -> str:
        return "SecretEnv(" + ", ".join(f"{name}={MASK}" for name in self._names) + ")"

    __str__ = __repr__


def seal(values: Mapping[str, str], *, owner_pk: int) -> str:
    """Values a form must not show again but must not lose (a form re-shown with an error): an
    encrypted, authenticated token for one user, read back by ``unseal``."""
    return _fernet().encrypt(json.dumps({"owner": owner_pk, "values": dict(values)}).encode()).decode()


def unseal(token: str, *, owner_pk: int, max_age: int = 86400) -> dict[str, str]:
    """The values ``seal`` sealed for this user ({} if the token is not one, is old or another's)."""
    if not token:
        return {}
    try:
        record = json.loads(_fernet().decrypt(token.encode(), ttl=max_age))
    except (InvalidToken, ValueError):
        return {}
    if not isinstance(record, dict) or record.get("owner") != owner_pk or not isinstance(record.get("values"), dict):
        return {}
    return {str(name): str(value) for name, value in record["values"].items()}


def split_secrets(env: Mapping[str, str], secret: Mapping[str, str] | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """``env`` and ``secret`` as (plain, secret): a variable whose name is secret by default moves
    to the secret ones; a name given in both is the secret one."""
    plain = {name: value for name, value in env.items() if not is_secret_name(name)}
    secrets = {name: value for name, value in env.items() if is_secret_name(name)}
    secrets.update(secret or {})
    for name in secrets:
        plain.pop(name, None)
    return plain, secrets


class SecretEnvField(models.Field):
    """A ``SecretEnv`` in a text column (see the module's docstring); a dict assigned to it is
    encrypted when saved."""

    description = "secret environment variables, encrypted"
    # What django-stubs' plugin reads as the attribute's types.
    _pyi_private_set_type: SecretEnv | Mapping[str, str]
    _pyi_private_get_type: SecretEnv

    def get_internal_type(self) -> str:
        return "TextField"

    def from_db_value(self, value: str | None, expression, connection) -> SecretEnv:
        try:
            return SecretEnv.from_stored(value)
        except SecretUnreadable:
            return SecretEnv()

    def to_python(self, value: object) -> SecretEnv:
        if isinstance(value, SecretEnv):
            return value
        if isinstance(value, Mapping):
            return SecretEnv.of({str(k): str(v) for k, v in value.items()})
        return SecretEnv.from_stored(value if isinstance(value, str) else None)

    def get_prep_value(self, value: object) -> str:
        return self.to_python(value).stored()

    def value_to_string(self, obj: models.Model) -> str:
        # dumpdata and the like: the encrypted form only.
        return self.get_prep_value(self.value_from_object(obj))


def no_secrets() -> SecretEnv:
    return SecretEnv()
