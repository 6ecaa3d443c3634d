"""System checks for a scale-out deployment (``manage.py check --deploy`` shows them)."""

from __future__ import annotations

from urllib.parse import urlparse

from django.conf import settings
from django.core import checks


@checks.register(checks.Tags.security, deploy=True)
def services_need_credentials(app_configs, **kwargs) -> list[checks.CheckMessage]:
    """A multi-node job uses its nodes' network: a database or a broker that takes no password
    answers it. The deployment's PostgreSQL and Redis must require credentials."""
    found: list[checks.CheckMessage] = []
    database = settings.DATABASES.get("default", {})
    if database.get("ENGINE", "").endswith("postgresql") and not database.get("PASSWORD"):
        found.append(
            checks.Warning(
                "DATABASE_URL has no password: a multi-node job, which runs on its nodes' network, could connect to the database.",
                hint="Give the console's PostgreSQL role a password (ALTER ROLE … PASSWORD …, scram-sha-256 in pg_hba.conf) "
                "and put it in DATABASE_URL (postgres://console:SECRET@host/console).",
                id="console.W001",
            )
        )
    redis_url = getattr(settings, "REDIS_URL", "") or ""
    if redis_url and not urlparse(redis_url).password:
        found.append(
            checks.Warning(
                "REDIS_URL has no password: a multi-node job, which runs on its nodes' network, could use the broker.",
                hint="Set requirepass (or an ACL user) in redis.conf and put it in REDIS_URL (redis://:SECRET@host:6379/0).",
                id="console.W002",
            )
        )
    return found
