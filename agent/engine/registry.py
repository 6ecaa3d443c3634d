"""The local registry (Debian's docker-registry, distribution v2): started detached on loopback,
optionally behind htpasswd; and the htpasswd and containers-auth.json files."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Mapping
from pathlib import Path

from agent.engine._util import _locked, _write_if_changed
from agent.engine.config import SYSTEM_PATH, EngineConfig, trust_local_registry

DEFAULT_PORT = 5000


def ensure_registry(
    root: Path,
    port: int = DEFAULT_PORT,
    *,
    name: str = "registry",
    htpasswd: Path | None = None,
    realm: str = "satrain-registry",
    insecure: bool = True,
    timeout: float = 20.0,
) -> str:
    """Makes sure a registry answers ``GET /v2/`` on 127.0.0.1:port and returns that address.

    If something already answers there (a registry: it sends Docker-Distribution-Api-Version), it
    is reused. Otherwise Debian's ``docker-registry`` is started, detached (its own session,
    reparented to init), bound to loopback only, with its config, pid file, log and storage under
    ``root/<name>/``. ``htpasswd`` (a bcrypt htpasswd file, see ``write_htpasswd``) turns on basic
    auth: the registry then answers 401 without credentials. ``insecure`` marks the address as
    plain HTTP in registries.conf (the normal case for a loopback registry; False leaves it out,
    so Podman insists on HTTPS, which is how a wrong scheme looks)."""
    root = Path(root).absolute()
    address = f"127.0.0.1:{int(port)}"
    home = root / name
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    home.mkdir(mode=0o700, exist_ok=True)
    if insecure:
        trust_local_registry(root, address)
    else:
        EngineConfig(root).write()
    with _locked(home / ".lock"):
        if _registry_answers(address):
            return address
        pid = _registry_pid(home)
        if pid is None:
            if _port_taken(int(port)):
                raise RuntimeError(f"127.0.0.1:{port} is taken by something that is not a registry")
            binary = shutil.which("docker-registry", path=SYSTEM_PATH)
            if binary is None:
                raise RuntimeError("docker-registry is not installed (as root: apt-get install docker-registry)")
            config = _write_registry_config(home, int(port), htpasswd, realm)
            log = home / "registry.log"
            # sh starts the registry in the background and exits: the registry is nobody's child.
            proc = subprocess.run(
                ["/bin/sh", "-c", 'exec </dev/null; "$0" serve "$1" >>"$2" 2>&1 & echo $!', binary, str(config), str(log)],
                env={"PATH": SYSTEM_PATH, "LANG": "C.UTF-8", "HOME": str(home), "TMPDIR": str(root / "tmp")},
                cwd=home,
                capture_output=True,
                text=True,
                timeout=10,
                start_new_session=True,
            )
            pid = int(proc.stdout.strip())
            _write_if_changed(home / "registry.pid", f"{pid}\n")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _registry_answers(address):
                return address
            if not _pid_alive(pid):
                break
            time.sleep(0.05)
        tail = _tail(home / "registry.log")
        raise RuntimeError(f"the registry on {address} did not start: {tail or 'no output'}")


def stop_registry(root: Path, *, name: str = "registry", timeout: float = 10.0) -> bool:
    """Stops the registry ``ensure_registry`` started under ``root/<name>`` (SIGTERM, then
    SIGKILL after ``timeout``). True when one was running."""
    home = Path(root).absolute() / name
    pid_file = home / "registry.pid"
    with _locked(home / ".lock") if home.is_dir() else contextlib.nullcontext():
        pid = _registry_pid(home)
        if pid is None:
            pid_file.unlink(missing_ok=True)
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            while _pid_alive(pid):
                time.sleep(0.05)
        pid_file.unlink(missing_ok=True)
        return True


def registry_answers(address: str, timeout: float = 2.0) -> bool:
    """Whether a registry (distribution's API v2) answers ``GET http://address/v2/``."""
    return _registry_answers(address, timeout)


def write_htpasswd(path: Path, users: Mapping[str, str]) -> Path:
    """Writes an htpasswd file with bcrypt hashes (what docker-registry's htpasswd auth accepts),
    mode 0600. Uses the ``bcrypt`` package if installed, else the C library's crypt ($2b$), else
    ``htpasswd -B`` (apache2-utils)."""
    lines = [f"{user}:{_bcrypt(password)}\n" for user, password in users.items()]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_if_changed(path, "".join(lines), mode=0o600, force=True)
    return path


def write_auth_file(path: Path, credentials: Mapping[str, tuple[str, str]]) -> Path:
    """Writes a containers-auth.json (``--authfile``) for {registry: (username, password)},
    mode 0600, readable by the agent only."""
    auths = {
        registry: {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}
        for registry, (user, password) in credentials.items()
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_if_changed(path, json.dumps({"auths": auths}, indent=1) + "\n", mode=0o600, force=True)
    return path


def _write_registry_config(home: Path, port: int, htpasswd: Path | None, realm: str) -> Path:
    data = home / "data"
    data.mkdir(mode=0o700, exist_ok=True)
    secret_file = home / "http-secret"
    if not secret_file.exists():
        _write_if_changed(secret_file, secrets.token_hex(32) + "\n", mode=0o600)
    secret = secret_file.read_text().strip()
    auth = ""
    if htpasswd is not None:
        htpasswd = Path(htpasswd).absolute()
        if not htpasswd.is_file():
            raise FileNotFoundError(f"htpasswd file {htpasswd} does not exist")
        auth = f"auth:\n  htpasswd:\n    realm: {json.dumps(realm)}\n    path: {json.dumps(str(htpasswd))}\n"
    text = (
        "# Written by agent/engine.py: a registry for the console, on loopback only.\n"
        "version: 0.1\n"
        "log:\n  level: warn\n  accesslog:\n    disabled: true\n"
        "storage:\n"
        f"  filesystem:\n    rootdirectory: {json.dumps(str(data))}\n"
        "  delete:\n    enabled: true\n"
        "  cache:\n    blobdescriptor: inmemory\n"
        "http:\n"
        f"  addr: 127.0.0.1:{port}\n"
        f"  secret: {secret}\n"
        "  headers:\n    X-Content-Type-Options: [nosniff]\n"
        f"{auth}"
    )
    config = home / "config.yml"
    _write_if_changed(config, text, mode=0o600)
    return config


def _registry_answers(address: str, timeout: float = 2.0) -> bool:
    # No proxy: a loopback address is never sent through the caller's http_proxy.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://{address}/v2/", timeout=timeout) as response:
            headers = response.headers
    except urllib.error.HTTPError as exc:  # 401 from a private registry is an answer too
        headers = exc.headers
    except (OSError, ValueError):
        return False
    return "registry/2.0" in (headers.get("Docker-Distribution-Api-Version") or "")


def _registry_pid(home: Path) -> int | None:
    try:
        pid = int((home / "registry.pid").read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    if not _pid_alive(pid):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if not any(part.endswith(b"docker-registry") for part in cmdline) or str(home / "config.yml").encode() not in cmdline:
        return None  # a recycled pid: not our registry
    return pid


def _pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def _port_taken(port: int) -> bool:

    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _bcrypt(password: str) -> str:
    try:
        import bcrypt  # optional: python3-bcrypt where it is installed, else htpasswd's own hash below

        return bcrypt.hashpw(password.encode(), bcrypt.gensalt()).decode()
    except ImportError:
        pass

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            import crypt  # removed in Python 3.13

            hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))
            if hashed and hashed.startswith("$2"):
                return hashed
        except (ImportError, AttributeError, OSError):
            pass
    if shutil.which("htpasswd"):
        proc = subprocess.run(
            ["htpasswd", "-niB", "user"], input=password + "\n", capture_output=True, text=True, check=True
        )
        return proc.stdout.strip().split(":", 1)[1]
    raise RuntimeError("no bcrypt here: pip install bcrypt, or apt-get install apache2-utils")


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""
