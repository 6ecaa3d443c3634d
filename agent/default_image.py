"""The embedded default's images: the local registry on loopback and the default training image
in it, built on first use (``agent.engine.build_default_image``) and reused afterwards.

The image is built under a tag that names its recipe (a change of the recipe builds a new one),
then also tagged with the name jobs use (``DEFAULT_IMAGE``, e.g. ``pytorch:2.13-py3.11``).
"""
from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from agent import engine


def ensure(root: Path, port: int, name: str, log: Callable[[str], None] = print) -> dict:
    """Start the local registry and make sure it holds the default image under ``name``
    (``127.0.0.1:<port>/<repository>:<tag>``). Returns the build's figures (``cached``: it was
    there already) and ``seconds`` of the whole call."""
    started = time.monotonic()
    address = engine.ensure_registry(root, port)
    built = engine.build_default_image(root, address, log=log)
    target = f"{address}/{name}"
    have = engine.resolve_digest(root, target)
    if not have.ok or have.digest != built.get("digest"):
        tool = engine.podman_argv(root, "skopeo")
        subprocess.run(
            [*tool, "copy", "--quiet", "--src-tls-verify=false", "--dest-tls-verify=false",
             f"docker://{built['reference']}", f"docker://{target}"],
            check=True, capture_output=True, timeout=600,
        )
    return {**built, "alias": target, "seconds_total": time.monotonic() - started}
