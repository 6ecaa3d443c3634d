"""Can containers run here? ``podman info`` with the engine's configuration, cached per process
and root."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

from agent.engine.config import clean_env, missing_tools
from agent.engine.pulls import registry_message

_AVAILABILITY: dict[Path, tuple[bool, str]] = {}
_AVAILABILITY_LOCK = threading.Lock()


def availability(root: Path, *, refresh: bool = False) -> tuple[bool, str]:
    """(True, what runs) when Podman can run containers with root's configuration, else (False,
    why not, and what to install). ``podman info`` is the probe (the first call initialises the
    storage, ~2.5 s); the answer is cached per process and root."""
    key = Path(root).absolute()
    with _AVAILABILITY_LOCK:
        if not refresh and key in _AVAILABILITY:
            return _AVAILABILITY[key]
    answer = _probe(key)
    with _AVAILABILITY_LOCK:
        _AVAILABILITY[key] = answer
    return answer


def _probe(root: Path) -> tuple[bool, str]:
    missing = missing_tools(("podman", "runc"))
    if missing:
        return False, (f"containers cannot run here: {' and '.join(missing)} not installed (as root: apt-get install {' '.join(missing)})")
    try:
        proc = subprocess.run(
            ["podman", "info", "--format", "json"],
            check=False,
            env=clean_env(root),
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"containers cannot run here: podman info failed: {exc}"
    if proc.returncode != 0:
        why = registry_message(proc.stderr) or f"exit status {proc.returncode}"
        hint = "" if os.geteuid() == 0 else f" (the console runs as uid {os.geteuid()}, not root)"
        return False, f"containers cannot run here: podman info failed{hint}: {why}"
    try:
        info = json.loads(proc.stdout)
        runtime = info["host"]["ociRuntime"]["name"]
        version = info["version"]["Version"]
        graphroot = info["store"]["graphRoot"]
        cgroups = info["host"].get("cgroupManager", "?")
    except (ValueError, KeyError, TypeError) as exc:
        return False, f"containers cannot run here: unreadable podman info ({exc})"
    if runtime != "runc":
        return False, f'containers cannot run here: podman uses {runtime}, not runc (set runtime = "runc")'
    return True, f"podman {version} with runc ({cgroups} cgroups), storage in {graphroot}"
