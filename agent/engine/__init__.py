"""The container engine's plumbing: Podman's configuration, the local registry, the default
training image, and pulls whose failures come back in the registry's own words.

Standard library only and no Django import: the root-run job supervisor and the console's Django
code both use it, so every function takes the directories it works in explicitly. ``root`` is the
engine's own directory (the console passes ``<VAR_DIR>/podman``); everything this package writes
lives under it:

    root/containers.conf, storage.conf, registries.conf   from the templates in deploy/podman/
    root/local-registries      the loopback registries registries.conf marks insecure (HTTP)
    root/storage, root/run     Podman's image store and run state
    root/<name>/               one local registry: config.yml, htpasswd, registry.pid, registry.log, data/
    root/platform-auth.json    the platform's credentials for those registries (0600, REGISTRY_AUTH_FILE)
    root/build/                the default image's build directory (removed after each build)

Every podman/skopeo/docker-registry run here gets a clean environment (``clean_env``): nothing of
the caller's environment (a job's ``GCONV_PATH``, a ``REGISTRY_HTTP_ADDR``, a proxy) reaches a tool
run as root. The one exception is pip during the image build, which runs with the caller's
environment on purpose (this machine's pip configuration lives partly in ``PIP_*`` variables).

The package's modules: ``config`` (EngineConfig, podman_env, clean_env, podman_argv, the loopback
registries trusted, unmount_storage, missing_tools), ``probe`` (availability), ``registry`` (the
local registry, the platform's credentials for it, htpasswd and auth files), ``pulls``
(PullResult, pull, resolve_digest, auth_file_for, the registry's words, image references) and
``build`` (the default image). Everything is used as ``from agent import engine; engine.<name>``.
"""

from __future__ import annotations

from agent.engine.build import (
    DEFAULT_DEBS,
    DEFAULT_MIRRORS,
    DEFAULT_REPOSITORY,
    DEFAULT_SUITE,
    DPKG_EXCLUDES,
    EXTRA_PIP,
    IMAGE_PATH_ENV,
    IMAGE_PYTHON,
    RECIPE_VERSION,
    build_default_image,
    default_packages,
    default_reference,
    image_size,
    verify_image,
)
from agent.engine.config import (
    REFUSED_ALIAS_HOST,
    REPO_DIR,
    SYSTEM_PATH,
    SYSTEM_REGISTRIES_D,
    TEMPLATE_DIR,
    EngineConfig,
    clean_env,
    missing_tools,
    podman_argv,
    podman_env,
    trust_local_registry,
    unmount_storage,
    untrust_local_registry,
)
from agent.engine.probe import availability
from agent.engine.pulls import (
    PullResult,
    auth_file_for,
    classify,
    pull,
    registry_message,
    resolve_digest,
    split_reference,
    valid_reference,
)
from agent.engine.registry import (
    DEFAULT_PORT,
    PLATFORM_USER,
    ensure_registry,
    platform_credentials,
    registry_answers,
    stop_registry,
    write_auth_file,
    write_htpasswd,
)

__all__ = [
    "DEFAULT_DEBS",
    "DEFAULT_MIRRORS",
    "DEFAULT_PORT",
    "DEFAULT_REPOSITORY",
    "DEFAULT_SUITE",
    "DPKG_EXCLUDES",
    "EXTRA_PIP",
    "IMAGE_PATH_ENV",
    "IMAGE_PYTHON",
    "PLATFORM_USER",
    "RECIPE_VERSION",
    "REFUSED_ALIAS_HOST",
    "REPO_DIR",
    "SYSTEM_PATH",
    "SYSTEM_REGISTRIES_D",
    "TEMPLATE_DIR",
    "EngineConfig",
    "PullResult",
    "auth_file_for",
    "availability",
    "build_default_image",
    "classify",
    "clean_env",
    "default_packages",
    "default_reference",
    "ensure_registry",
    "image_size",
    "missing_tools",
    "platform_credentials",
    "podman_argv",
    "podman_env",
    "pull",
    "registry_answers",
    "registry_message",
    "resolve_digest",
    "split_reference",
    "stop_registry",
    "trust_local_registry",
    "unmount_storage",
    "untrust_local_registry",
    "valid_reference",
    "verify_image",
    "write_auth_file",
    "write_htpasswd",
]
