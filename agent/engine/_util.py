"""Small file helpers of the engine package: atomic writes, an advisory lock, auth files read."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from pathlib import Path


def _write_if_changed(path: Path, text: str, *, mode: int = 0o644, force: bool = False) -> bool:
    """Writes ``text`` atomically (temp file, rename) unless the file already holds it."""
    path = Path(path)
    if not force:
        with contextlib.suppress(FileNotFoundError, UnicodeDecodeError):
            if path.read_text() == text:
                return False
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    return True


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_auths(path: Path) -> dict[str, dict]:
    """The ``auths`` of a containers-auth.json ({registry: {"auth": base64}}); {} when the file
    is missing or not one."""
    try:
        auths = json.loads(Path(path).read_text()).get("auths")
    except (OSError, ValueError, AttributeError):
        return {}
    return {str(k): v for k, v in auths.items() if isinstance(v, dict)} if isinstance(auths, dict) else {}
