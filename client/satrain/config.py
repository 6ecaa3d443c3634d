"""Where the client keeps the console's address and the API token.

``$SATRAIN_CONFIG_DIR`` or ``$XDG_CONFIG_HOME/satrain`` or ``~/.config/satrain``; the file
``config.json`` is created with mode 0600 (it holds a bearer token). ``SATRAIN_URL`` and
``SATRAIN_TOKEN`` in the environment win over the file (for CI).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_URL = "http://127.0.0.1:8000"


def config_dir() -> Path:
    if os.environ.get("SATRAIN_CONFIG_DIR"):
        return Path(os.environ["SATRAIN_CONFIG_DIR"])
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "satrain"


def config_path() -> Path:
    return config_dir() / "config.json"


@dataclass
class Settings:
    url: str = DEFAULT_URL
    token: str | None = None
    username: str | None = None


def load() -> Settings:
    settings = Settings()
    try:
        data = json.loads(config_path().read_text())
        settings = Settings(url=data.get("url") or DEFAULT_URL, token=data.get("token"), username=data.get("username"))
    except (OSError, ValueError):
        pass
    if os.environ.get("SATRAIN_URL"):
        settings.url = os.environ["SATRAIN_URL"]
    if os.environ.get("SATRAIN_TOKEN"):
        settings.token = os.environ["SATRAIN_TOKEN"]
    settings.url = settings.url.rstrip("/")
    return settings


def save(settings: Settings) -> Path:
    """Write the settings; the file is readable by its owner only (0600), its folder 0700."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"url": settings.url, "token": settings.token, "username": settings.username}, out)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path
