"""The local registry (Debian's docker-registry, distribution v2): started detached on loopback,
behind htpasswd (the platform's own credentials, generated once, unless given other users) with
deletes off; and the htpasswd and containers-auth.json files."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import os
import re
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

from agent.engine._util import _locked, _write_if_changed, read_auths
from agent.engine.config import SYSTEM_PATH, EngineConfig, trust_local_registry

DEFAULT_PORT = 5000
# The platform's user in its registries' htpasswd (its password: ``platform_credentials``).
PLATFORM_USER = "satrain-platform"


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
    """Makes sure our registry answers ``GET /v2/`` on 127.0.0.1:port and returns that address.

    Debian's ``docker-registry`` is started, detached (its own session, reparented to init), bound
    to loopback only, with its config, pid file, log and storage under ``root/<name>/``. Every
    registry started here wants credentials for every request (docker-registry's htpasswd auth
    covers reads too: it answers 401 without them) and refuses deletes, so a job that reaches
    loopback can neither read, push nor delete. Without ``htpasswd`` the credentials are the
    platform's own (``platform_credentials``: a random password generated once per address and
    kept in root's platform auth file, which every podman/skopeo run of ``clean_env`` and every
    pull of ``pull`` uses); ``htpasswd`` (a bcrypt htpasswd file, see ``write_htpasswd``) gives
    other users instead (a team's private registry, in the tests).

    Our registry already running under ``root/<name>`` is reused while its configuration is the
    one wanted; with another one (an earlier version's without credentials, another port, another
    htpasswd) it is restarted with this one. Something else that answers as a registry on the
    port is reused as before, unless it answers without credentials. ``insecure`` marks the
    address as plain HTTP in registries.conf (the normal case for a loopback registry; False leaves
    it out, so Podman insists on HTTPS, which is how a wrong scheme looks)."""
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
        if htpasswd is None:
            user, password = platform_credentials(root, address)
            htpasswd = _platform_htpasswd(home / "htpasswd", user, password, EngineConfig(root).platform_auth_file)
        else:
            _forget_platform_credentials(root, address)  # its users are the htpasswd's, not ours
        config, changed = _write_registry_config(home, int(port), htpasswd, realm)
        pid = _registry_pid(home)
        if pid is not None and changed:
            _stop_process(pid, 10.0)
            (home / "registry.pid").unlink(missing_ok=True)
            pid = None
        if _registry_answers(address):
            if pid is None and _answers_anonymously(address):
                raise RuntimeError(
                    f"{address} is served by a registry not started under {home} that answers without credentials: "
                    "stop it, the platform's registry wants credentials for every request"
                )
            return address
        if pid is None:
            if _port_taken(int(port)):
                raise RuntimeError(f"127.0.0.1:{port} is taken by something that is not a registry")
            binary = shutil.which("docker-registry", path=SYSTEM_PATH)
            if binary is None:
                raise RuntimeError("docker-registry is not installed (as root: apt-get install docker-registry)")
            log = home / "registry.log"
            # sh starts the registry in the background and exits: the registry is nobody's child.
            proc = subprocess.run(
                ["/bin/sh", "-c", 'exec </dev/null; "$0" serve "$1" >>"$2" 2>&1 & echo $!', binary, str(config), str(log)],
                check=False,
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
    SIGKILL after ``timeout``); the platform's credentials for it are forgotten (a later start
    makes new ones). True when one was running."""
    root = Path(root).absolute()
    home = root / name
    pid_file = home / "registry.pid"
    with _locked(home / ".lock") if home.is_dir() else contextlib.nullcontext():
        pid = _registry_pid(home)
        if pid is None:
            pid_file.unlink(missing_ok=True)
            return False
        _stop_process(pid, timeout)
        pid_file.unlink(missing_ok=True)
        address = _configured_address(home)
        if address is not None:
            _forget_platform_credentials(root, address)
        return True


def platform_credentials(root: Path, address: str) -> tuple[str, str]:
    """The platform's (username, password) for its registry at ``address``: a random password
    generated on first use and kept in root's platform auth file (``EngineConfig.platform_auth_file``,
    mode 0600 under the console's var/ directory, read by the console and its agents only, never
    shown to a job), then the same on every later call."""
    config = EngineConfig(Path(root))
    config.write()
    with _locked(config.root / ".platform-auth.lock"):
        auths = read_auths(config.platform_auth_file)
        found = _decode_auth(auths.get(address))
        if found is not None and found[0] == PLATFORM_USER:
            return found
        password = secrets.token_urlsafe(32)
        auths[address] = {"auth": base64.b64encode(f"{PLATFORM_USER}:{password}".encode()).decode()}
        _write_if_changed(config.platform_auth_file, json.dumps({"auths": auths}, indent=1) + "\n", mode=0o600, force=True)
        return PLATFORM_USER, password


def registry_answers(address: str, timeout: float = 2.0) -> bool:
    """Whether a registry (distribution's API v2) answers ``GET http://address/v2/``."""
    return _registry_answers(address, timeout)


def write_htpasswd(path: Path, users: Mapping[str, str], *, cost: int = 12) -> Path:
    """Writes an htpasswd file with bcrypt hashes of ``cost`` (what docker-registry's htpasswd
    auth accepts), mode 0600. Uses the ``bcrypt`` package if installed, else the C library's
    crypt ($2b$), else ``htpasswd -B`` (apache2-utils)."""
    lines = [f"{user}:{_bcrypt(password, cost)}\n" for user, password in users.items()]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_if_changed(path, "".join(lines), mode=0o600, force=True)
    return path


def write_auth_file(path: Path, credentials: Mapping[str, tuple[str, str]]) -> Path:
    """Writes a containers-auth.json (``--authfile``) for {registry: (username, password)},
    mode 0600, readable by the agent only."""
    auths = {registry: {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()} for registry, (user, password) in credentials.items()}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_if_changed(path, json.dumps({"auths": auths}, indent=1) + "\n", mode=0o600, force=True)
    return path


def _write_registry_config(home: Path, port: int, htpasswd: Path, realm: str) -> tuple[Path, bool]:
    """Writes ``home/config.yml``; (its path, whether it changed). The htpasswd's hash is part of
    it, so a changed htpasswd changes the config too (docker-registry reads it at start only)."""
    data = home / "data"
    data.mkdir(mode=0o700, exist_ok=True)
    secret_file = home / "http-secret"
    if not secret_file.exists():
        _write_if_changed(secret_file, secrets.token_hex(32) + "\n", mode=0o600)
    secret = secret_file.read_text().strip()
    htpasswd = Path(htpasswd).absolute()
    try:
        users = hashlib.sha256(htpasswd.read_bytes()).hexdigest()
    except FileNotFoundError:
        raise FileNotFoundError(f"htpasswd file {htpasswd} does not exist") from None
    text = (
        "# Written by agent/engine/registry.py: a registry for the console, on loopback only;\n"
        "# credentials for every request, no deletes.\n"
        f"# htpasswd sha256: {users}\n"
        "version: 0.1\n"
        "log:\n  level: warn\n  accesslog:\n    disabled: true\n"
        "storage:\n"
        f"  filesystem:\n    rootdirectory: {json.dumps(str(data))}\n"
        "  delete:\n    enabled: false\n"
        "  cache:\n    blobdescriptor: inmemory\n"
        "http:\n"
        f"  addr: 127.0.0.1:{port}\n"
        f"  secret: {secret}\n"
        "  headers:\n    X-Content-Type-Options: [nosniff]\n"
        f"auth:\n  htpasswd:\n    realm: {json.dumps(realm)}\n    path: {json.dumps(str(htpasswd))}\n"
    )
    config = home / "config.yml"
    return config, _write_if_changed(config, text, mode=0o600)


def _configured_address(home: Path) -> str | None:
    try:
        found = re.search(r"^  addr: (127\.0\.0\.1:\d+)$", (home / "config.yml").read_text(), re.MULTILINE)
    except OSError:
        return None
    return found.group(1) if found else None


def _platform_htpasswd(path: Path, user: str, password: str, auth_file: Path) -> Path:
    """``path`` holding the platform's user alone, rewritten only when it does not (a rewrite
    changes the registry's config, which restarts it). Cost 4: the password is 43 random
    characters, so a slow hash buys nothing, and the registry checks it on every request."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        name, _, hashed = path.read_text().strip().partition(":")
        if name == user and "\n" not in hashed:
            matches = _bcrypt_matches(password, hashed)
            if matches is None:  # no bcrypt to check with: trust a file written after the password
                matches = path.stat().st_mtime_ns >= auth_file.stat().st_mtime_ns
            if matches:
                return path.absolute()
    return write_htpasswd(path, {user: password}, cost=4).absolute()


def _forget_platform_credentials(root: Path, address: str) -> None:
    config = EngineConfig(root)
    with _locked(config.root / ".platform-auth.lock"):
        auths = read_auths(config.platform_auth_file)
        if auths.pop(address, None) is not None:
            _write_if_changed(config.platform_auth_file, json.dumps({"auths": auths}, indent=1) + "\n", mode=0o600, force=True)


def _decode_auth(entry: object) -> tuple[str, str] | None:
    if not isinstance(entry, dict):
        return None
    try:
        user, sep, password = base64.b64decode(str(entry.get("auth", "")), validate=True).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return None
    return (user, password) if sep and user and password else None


def _answers_anonymously(address: str) -> bool:
    """Whether ``GET /v2/`` at ``address`` succeeds without credentials."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://{address}/v2/", timeout=2.0) as response:
            return 200 <= response.status < 300
    except (OSError, ValueError):  # HTTPError (401) included
        return False


def _stop_process(pid: int, timeout: float) -> None:
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


def _bcrypt(password: str, cost: int = 12) -> str:
    try:
        import bcrypt  # optional: python3-bcrypt where it is installed, else htpasswd's own hash below

        return bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode()
    except ImportError:
        pass

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            import crypt  # removed in Python 3.13

            hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=2**cost))
            if hashed and hashed.startswith("$2"):
                return hashed
        except (ImportError, AttributeError, OSError):
            pass
    if shutil.which("htpasswd"):
        proc = subprocess.run(["htpasswd", "-niB", "-C", str(cost), "user"], input=password + "\n", capture_output=True, text=True, check=True)
        return proc.stdout.strip().split(":", 1)[1]
    raise RuntimeError("no bcrypt here: pip install bcrypt, or apt-get install apache2-utils")


def _bcrypt_matches(password: str, hashed: str) -> bool | None:
    """Whether ``hashed`` (a bcrypt hash) is ``password``'s; None when it cannot be told here."""
    try:
        import bcrypt

        return bcrypt.checkpw(password.encode(), hashed.encode())
    except ImportError:
        pass
    except ValueError:
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            import crypt

            return hmac.compare_digest(crypt.crypt(password, hashed) or "", hashed)
        except (ImportError, AttributeError, OSError):
            return None


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""
