"""Helpers of the local registry's tests (the fixture is ``platform_registry`` in conftest.py): a
registry as the platform starts it, requests to it as a job on loopback could send them, and a
one-file image pushed the way the platform pushes."""

from __future__ import annotations

import base64
import dataclasses
import io
import os
import subprocess
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

from agent import engine


@dataclasses.dataclass(frozen=True)
class PlatformRegistry:
    """A registry ``engine.ensure_registry`` started (the platform's credentials), holding a
    one-file image under ``reference`` (``digest``: its manifest's)."""

    root: Path
    address: str
    reference: str
    digest: str

    def request(self, method: str, path: str, **options) -> tuple[int, bytes]:
        """``registry_request`` to this registry."""
        return registry_request(method, f"http://{self.address}{path}", **options)


def registry_request(method: str, url: str, *, credentials: tuple[str, str] | None = None, data: bytes | None = None,
                     headers: dict[str, str] | None = None) -> tuple[int, bytes]:  # fmt: skip
    """(status, body) of ``method url``, as a job on loopback could send it (basic auth when
    ``credentials`` are given)."""
    request = urllib.request.Request(url, method=method, data=data, headers=headers or {})
    if credentials is not None:
        token = base64.b64encode(":".join(credentials).encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def containers_unavailable(path: Path) -> str | None:
    missing = engine.missing_tools(("podman", "runc", "skopeo", "docker-registry"))
    if missing:
        return f"{', '.join(missing)} not installed (as root: apt-get install {' '.join(missing)})"
    if os.geteuid() != 0:
        return f"the container engine runs as root and these tests run as uid {os.geteuid()}"
    ready, why = engine.availability(path)
    return None if ready else why


def push_tiny_image(root: Path, reference: str, content: bytes = b"a tiny image for the registry's tests\n") -> str:
    """Imports a one-file image as ``reference`` and pushes it with the engine's environment (the
    platform's credentials); returns the manifest digest the registry stored."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo("hello.txt")
        info.size, info.mtime = len(content), 1_700_000_000
        archive.addfile(info, io.BytesIO(content))
    tarball = root / "tiny.tar"
    tarball.write_bytes(buffer.getvalue())
    env = engine.clean_env(root)
    subprocess.run(["podman", "import", "--quiet", str(tarball), reference], env=env, check=True, capture_output=True, timeout=120)
    digest_file = root / "digest"
    proc = subprocess.run(
        ["podman", "push", "--quiet", "--tls-verify=false", "--digestfile", str(digest_file), reference], check=False,
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return digest_file.read_text().strip()
