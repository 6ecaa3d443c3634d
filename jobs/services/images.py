"""Images as OCI references: where a job's image comes from and with which credentials."""

from __future__ import annotations

import base64
import logging
import re

from django.conf import settings
from django.core.exceptions import ValidationError

from jobs.models import IMAGE_REFERENCE, Registry, RegistryCredential, TrainingJob

logger = logging.getLogger(__name__)

DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def has_registry(reference: str) -> bool:
    """Whether the reference names its registry (``host.tld/…``, ``host:port/…``, ``localhost/…``)."""
    first, slash, _ = reference.partition("/")
    return bool(slash) and ("." in first or ":" in first or first == "localhost")


def qualify(reference: str) -> str:
    """The full reference: a name without a registry is looked up in ``DEFAULT_REGISTRY``."""
    return reference if has_registry(reference) else f"{settings.DEFAULT_REGISTRY}/{reference}"


def registry_of(reference: str) -> str:
    return qualify(reference).split("/", 1)[0]


def repository_of(reference: str) -> str:
    """``registry/repository`` without tag or digest."""
    full = DIGEST.sub("", qualify(reference))
    head, _slash, last = full.rpartition("/")
    return f"{head}/{last.split(':', 1)[0]}"


def by_digest(reference: str, digest: str) -> str:
    """The reference that names exactly the image that ran (``registry/repository@sha256:…``)."""
    return f"{repository_of(reference)}@{digest}"


def known_registries() -> set[str]:
    return {settings.DEFAULT_REGISTRY, *Registry.objects.values_list("host", flat=True)}


def unknown_registry(reference: str) -> str | None:
    """Why a reference is certainly not pullable here (its registry is none the platform knows),
    or None."""
    host = registry_of(reference)
    if host in known_registries():
        return None
    known = ", ".join(sorted(known_registries()))
    return f"registry {host} is not one this platform pulls from (known: {known}); an operator adds registries in the admin"


def auth_for(job: TrainingJob) -> dict | None:
    """The auth file's content for the job's pull (Podman's ``auth.json``), or None: the
    project's own credential for the registry, else the registry's credential for every project.
    The platform's own local registry is pulled from with the platform's credentials whatever
    this returns (``engine.auth_file_for``)."""
    host = registry_of(job.image)
    found = (
        RegistryCredential.objects.filter(registry__host=host, project=job.project_id).first()
        or RegistryCredential.objects.filter(registry__host=host, project__isnull=True).first()
    )
    if found is None:
        return None
    password = found.readable_password()  # decrypted here only, for the pull's auth file
    if password is None:
        # The pull goes on without it and fails with the registry's "unauthorized".
        logger.error(
            "job %s: registry credential %s for %s cannot be used: its password cannot be decrypted with the console's "
            "SECRET_KEY (it changed; put the old one in SECRET_KEY_FALLBACKS, or enter the password again)",
            job.pk, found.pk, host,
        )  # fmt: skip
        return None
    token = base64.b64encode(f"{found.username}:{password}".encode()).decode()
    return {"auths": {host: {"auth": token}}}


def validate_reference(value: str) -> None:
    """An image reference a job may name: OCI syntax, and a registry the platform knows (a name
    without one is looked up in the local registry). Raises ValidationError with the reason."""
    IMAGE_REFERENCE(value)
    why = unknown_registry(value)
    if why:
        raise ValidationError(f"Image {value}: {why}.", code="unknown_registry")
