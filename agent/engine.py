"""The container engine's plumbing: Podman's configuration, the local registry, the default
training image, and pulls whose failures come back in the registry's own words.

Standard library only and no Django import: the root-run job supervisor and the console's Django
code both use it, so every function takes the directories it works in explicitly. ``root`` is the
engine's own directory (the console passes ``<VAR_DIR>/podman``); everything this module writes
lives under it:

    root/containers.conf, storage.conf, registries.conf   from the templates in deploy/podman/
    root/local-registries      the loopback registries registries.conf marks insecure (HTTP)
    root/storage, root/run     Podman's image store and run state
    root/<name>/               one local registry: config.yml, registry.pid, registry.log, data/
    root/build/                the default image's build directory (removed after each build)

Every podman/skopeo/docker-registry run here gets a clean environment (``clean_env``): nothing of
the caller's environment (a job's ``GCONV_PATH``, a ``REGISTRY_HTTP_ADDR``, a proxy) reaches a tool
run as root. The one exception is pip during the image build, which runs with the caller's
environment on purpose (this machine's pip configuration lives partly in ``PIP_*`` variables).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent
TEMPLATE_DIR = REPO_DIR / "deploy" / "podman"
DEFAULT_PORT = 5000
SYSTEM_REGISTRIES_D = Path("/etc/containers/registries.conf.d")
REFUSED_ALIAS_HOST = "short-names-are-refused.invalid"
# A clean PATH for tools run as root: the caller's PATH is not trusted either.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# The default training image: Debian bookworm (whose python3 is 3.11, so the host's cp311 wheels
# fit), the pinned CPU torch and the libraries the examples import.
DEFAULT_SUITE = "bookworm"
DEFAULT_MIRRORS = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
DEFAULT_DEBS = ("python3", "bash", "procps", "ca-certificates", "libstdc++6", "tzdata")
# Added to pyproject.toml's ``ckpt`` extra (torch, transformers, accelerate, safetensors, datasets).
EXTRA_PIP = ("numpy", "pyyaml")
IMAGE_PYTHON = "3.11"
IMAGE_PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_REPOSITORY = "satrain/default"
# Bumped when the recipe changes in a way the hashed inputs do not show.
RECIPE_VERSION = 1
# Documentation, manual pages and translations are left out of the rootfs.
DPKG_EXCLUDES = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/info/*",
)


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """The files that make ``podman`` and ``skopeo`` use the console's storage and registries."""

    root: Path
    template_dir: Path = TEMPLATE_DIR

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root).absolute())
        object.__setattr__(self, "template_dir", Path(self.template_dir))

    @property
    def containers_conf(self) -> Path:
        return self.root / "containers.conf"

    @property
    def storage_conf(self) -> Path:
        return self.root / "storage.conf"

    @property
    def registries_conf(self) -> Path:
        return self.root / "registries.conf"

    @property
    def local_registries_file(self) -> Path:
        return self.root / "local-registries"

    @property
    def home(self) -> Path:
        """HOME and XDG_CONFIG_HOME of the tools: no user-level containers.conf, auth.json or
        ~/.docker/config.json of whoever runs the console is read."""
        return self.root / "home"

    @property
    def no_auth_file(self) -> Path:
        """An auth file with no credentials, used when a pull is given none (so root's own
        auth.json is never consulted)."""
        return self.root / "no-auth.json"

    def local_registries(self) -> list[str]:
        """The loopback registries marked insecure (plain HTTP) in registries.conf."""
        try:
            text = self.local_registries_file.read_text()
        except FileNotFoundError:
            return []
        return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]

    def write(self) -> None:
        """Writes the three files from the templates (only where their content changed)."""
        for sub in ("", "tmp", "networks", "home", "build"):
            (self.root / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        _write_if_changed(self.no_auth_file, '{"auths": {}}\n', mode=0o600)
        for name in ("containers.conf", "storage.conf"):
            text = (self.template_dir / name).read_text().replace("@ROOT@", str(self.root))
            _write_if_changed(self.root / name, text)
        blocks = "\n".join(
            f'[[registry]]\nlocation = "{address}"\ninsecure = true\n' for address in self.local_registries()
        )
        text = (self.template_dir / "registries.conf").read_text()
        text = text.replace("@ROOT@", str(self.root)).replace("@LOCAL_REGISTRIES@", blocks or "# (none yet)")
        _write_if_changed(self.registries_conf, text)
        self._refuse_system_aliases()

    def _refuse_system_aliases(self) -> None:
        """Podman 4.3 reads /etc/containers/registries.conf.d/*.conf even when
        CONTAINERS_REGISTRIES_CONF is set (there is no variable for the directory), and Debian's
        shortnames.conf there maps ``python``, ``ubuntu``, … to docker.io. The per-user drop-in
        directory under our HOME is read after it, so every such alias is pointed there at a name
        that cannot resolve (RFC 2606 ``.invalid``): a short name never reaches a public registry."""
        import tomllib

        aliases: set[str] = set()
        for conf in sorted(SYSTEM_REGISTRIES_D.glob("*.conf")) if SYSTEM_REGISTRIES_D.is_dir() else []:
            with contextlib.suppress(OSError, ValueError):
                aliases.update(tomllib.loads(conf.read_text()).get("aliases", {}))
        drop_ins = self.home / ".config" / "containers" / "registries.conf.d"
        drop_ins.mkdir(mode=0o700, parents=True, exist_ok=True)
        lines = [
            "# Written by agent/engine.py: the system's short-name aliases, refused (see EngineConfig).\n",
            "[aliases]\n",
            *(f'{json.dumps(alias)} = "{REFUSED_ALIAS_HOST}/{_alias_path(alias)}"\n' for alias in sorted(aliases)),
        ]
        _write_if_changed(drop_ins / "99-refuse-system-aliases.conf", "".join(lines))

    def env(self) -> dict[str, str]:
        return {
            "CONTAINERS_CONF": str(self.containers_conf),
            "CONTAINERS_STORAGE_CONF": str(self.storage_conf),
            "CONTAINERS_REGISTRIES_CONF": str(self.registries_conf),
            # Podman reads per-user files (registries.conf.d, auth.json, containers.conf) from
            # there: ours, and never those of whoever runs the console.
            "HOME": str(self.home),
            "XDG_CONFIG_HOME": str(self.home / ".config"),
        }


def podman_env(root: Path) -> dict[str, str]:
    """Writes (idempotently) root's containers.conf, storage.conf and registries.conf, and returns
    the variables that make podman/skopeo use them: CONTAINERS_CONF, CONTAINERS_STORAGE_CONF,
    CONTAINERS_REGISTRIES_CONF, and HOME/XDG_CONFIG_HOME under root (Podman's per-user files).
    Prefer ``clean_env`` (these plus a fixed PATH, nothing of the caller's environment)."""
    config = EngineConfig(Path(root))
    config.write()
    return config.env()


def clean_env(root: Path) -> dict[str, str]:
    """The whole environment for a podman/skopeo run as root: a fixed PATH, C.UTF-8, HOME and
    XDG_CONFIG_HOME under root, TMPDIR under root, and ``podman_env``'s variables. Nothing of the
    caller's environment."""
    config = EngineConfig(Path(root))
    env = podman_env(config.root)
    env.update(PATH=SYSTEM_PATH, LANG="C.UTF-8", TMPDIR=str(config.root / "tmp"))
    return env


def podman_argv(root: Path, tool: str = "podman") -> list[str]:
    """An argv prefix that runs ``tool`` (podman, skopeo) with ``clean_env(root)`` and nothing
    else: ``subprocess.run([*podman_argv(root), "run", "--rm", ...])``."""
    env = clean_env(root)
    return ["/usr/bin/env", "-i", *(f"{key}={value}" for key, value in env.items()), shutil.which(tool) or tool]


def trust_local_registry(root: Path, address: str) -> None:
    """Marks ``address`` (``127.0.0.1:<port>``) insecure in root's registries.conf: Podman talks
    plain HTTP to it. Only loopback addresses are accepted."""
    if not re.fullmatch(r"(127\.0\.0\.1|localhost|\[::1\]):\d{1,5}", address):
        raise ValueError(f"only a loopback registry can be marked insecure, not {address!r}")
    config = EngineConfig(Path(root))
    config.root.mkdir(mode=0o700, parents=True, exist_ok=True)
    with _locked(config.root / ".config.lock"):
        current = config.local_registries()
        if address not in current:
            _write_if_changed(config.local_registries_file, "".join(f"{a}\n" for a in [*current, address]))
        config.write()


def untrust_local_registry(root: Path, address: str) -> None:
    config = EngineConfig(Path(root))
    with _locked(config.root / ".config.lock"):
        current = config.local_registries()
        if address in current:
            _write_if_changed(config.local_registries_file, "".join(f"{a}\n" for a in current if a != address))
        config.write()


def unmount_storage(root: Path) -> list[str]:
    """Unmounts what Podman left mounted under root (its overlay driver keeps
    ``root/storage/overlay`` bind-mounted on itself), deepest first, so that root can be removed.
    Run it only when no container of root's storage is running. Returns the mount points."""
    root = Path(root).absolute()
    points: list[str] = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].encode().decode("unicode_escape")
            if point == str(root) or point.startswith(f"{root}/"):
                points.append(point)
    for point in sorted(set(points), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], env={"PATH": SYSTEM_PATH}, capture_output=True, timeout=30)
    return sorted(set(points), key=len, reverse=True)


# --------------------------------------------------------------------------------------------
# Can containers run here?
# --------------------------------------------------------------------------------------------

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


def missing_tools(tools: Iterable[str] = ("podman", "runc", "skopeo", "docker-registry", "mmdebstrap")) -> list[str]:
    """Which of the engine's commands are not installed (Debian packages of the same names)."""
    return [tool for tool in tools if shutil.which(tool, path=SYSTEM_PATH) is None]


def _probe(root: Path) -> tuple[bool, str]:
    missing = missing_tools(("podman", "runc"))
    if missing:
        return False, (
            f"containers cannot run here: {' and '.join(missing)} not installed "
            f"(as root: apt-get install {' '.join(missing)})"
        )
    try:
        proc = subprocess.run(
            ["podman", "info", "--format", "json"],
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
        return False, f"containers cannot run here: podman uses {runtime}, not runc (set runtime = \"runc\")"
    return True, f"podman {version} with runc ({cgroups} cgroups), storage in {graphroot}"


# --------------------------------------------------------------------------------------------
# The local registry (Debian's docker-registry, distribution v2)
# --------------------------------------------------------------------------------------------


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
    import socket

    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _bcrypt(password: str) -> str:
    try:
        import bcrypt  # type: ignore[import-not-found]

        return bcrypt.hashpw(password.encode(), bcrypt.gensalt()).decode()
    except ImportError:
        pass
    import warnings

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


# --------------------------------------------------------------------------------------------
# Pulls and digests
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PullResult:
    """The outcome of a pull (or of a registry look-up), as a fact to report.

    ``message`` is the registry's own words on failure ("manifest unknown: manifest unknown",
    "unauthorized: authentication required", "… connect: connection refused", "http: server gave
    HTTP response to HTTPS client"), one line; on success a short summary. ``kind`` classifies a
    failure: ``not-found``, ``unauthorized``, ``unreachable``, ``wrong-scheme``, ``short-name``,
    ``invalid`` (not a reference), ``timeout``, ``error``; "" on success."""

    ok: bool
    digest: str | None
    message: str
    kind: str = ""
    image_id: str | None = None
    seconds: float = 0.0


def pull(
    root: Path,
    reference: str,
    auth_file: Path | None = None,
    *,
    timeout: float = 900.0,
    progress: Callable[[str], None] | None = None,
) -> PullResult:
    """Pulls ``reference`` into root's storage with Podman and returns the digest of the manifest
    pulled (``sha256:…``; with it, ``repository@digest`` names exactly what ran).

    ``--tls-verify=false`` is passed only for the loopback registries root's registries.conf
    marks insecure; any other registry is HTTPS with verification. ``auth_file`` (a
    containers-auth.json, see ``write_auth_file``) is passed as ``--authfile``; without one an
    empty auth file is used, so no credential lying around on the node is ever sent. ``progress``
    receives Podman's progress lines ("Trying to pull …", "Copying blob …") as they come.
    ``timeout`` bounds the whole pull (then ok=False, kind ``timeout``)."""
    started = time.monotonic()
    root = Path(root).absolute()
    refused = _refuse_short_name(reference)
    if refused is not None:
        return refused
    env = clean_env(root)
    auth = str(auth_file or EngineConfig(root).no_auth_file)
    argv = ["podman", "pull", *_tls_args(root, reference), "--authfile", auth, reference]
    rc, stdout, stderr, timed_out = _run_streaming(argv, env, timeout, progress)
    elapsed = time.monotonic() - started
    if timed_out:
        return PullResult(False, None, f"the pull of {reference} did not finish in {timeout:g} s", "timeout", None, elapsed)
    if rc != 0:
        message = registry_message(stderr) or f"podman pull exited with status {rc}"
        return PullResult(False, None, message, classify(message), None, elapsed)
    image_id = (stdout.strip().splitlines() or [None])[-1]
    digest = _local_digest(root, reference, env)
    if digest is None:  # several manifests of one image in the store: ask the registry which is the tag's
        looked_up = resolve_digest(root, reference, auth_file)
        digest = looked_up.digest
    short = digest[:19] if digest else "?"
    return PullResult(True, digest, f"pulled {reference} ({short}) in {elapsed:.1f} s", "", image_id, elapsed)


def resolve_digest(root: Path, reference: str, auth_file: Path | None = None, *, timeout: float = 60.0) -> PullResult:
    """Asks the registry (``skopeo inspect``, nothing is pulled) for the manifest digest that
    ``reference`` names now. ok=False with the registry's words as in ``pull``."""
    started = time.monotonic()
    root = Path(root).absolute()
    refused = _refuse_short_name(reference)
    if refused is not None:
        return refused
    argv = [
        "skopeo", "inspect", "--raw", *_tls_args(root, reference),
        "--authfile", str(auth_file or EngineConfig(root).no_auth_file), f"docker://{reference}",
    ]  # fmt: skip
    try:
        proc = subprocess.run(argv, env=clean_env(root), capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return PullResult(False, None, f"the registry did not answer for {reference} in {timeout:g} s", "timeout")
    elapsed = time.monotonic() - started
    if proc.returncode != 0:
        message = registry_message(proc.stderr.decode(errors="replace")) or f"skopeo exited with status {proc.returncode}"
        return PullResult(False, None, message, classify(message), None, elapsed)
    digest = "sha256:" + hashlib.sha256(proc.stdout).hexdigest()
    return PullResult(True, digest, f"{reference} is {digest[:19]}", "", None, elapsed)


def registry_message(stderr: str) -> str:
    """The last meaningful line of podman/skopeo's stderr, without the ``Error: `` prefix and
    without the layers of context the registry's answer is wrapped in when they are long."""
    lines = [line.rstrip() for line in stderr.splitlines() if line.strip()]
    for index in range(len(lines) - 1, -1, -1):
        line = lines[index]
        text = re.sub(r'^(Error: |time="[^"]*" level=(error|fatal) msg=")', "", line)
        if text == line and not line.startswith("Error"):
            continue
        if text != line and line.startswith("time="):
            text = text[: -1] if text.endswith('"') else text
            text = text.replace('\\"', '"')  # logrus quotes the message
        # skopeo 1.9 wraps every failure of inspect in this, whatever it was
        text = re.sub(r'^Error parsing image name "[^"]*": ', "", text)
        if re.search(r"\d+ errors? occurred:?$", text):
            details = [item.strip().lstrip("*").strip() for item in lines[index + 1 :] if item.strip().startswith("*")]
            text = "; ".join(details) or text
        return _shorten(text)
    return _shorten(lines[-1]) if lines else ""


_UNREACHABLE = (
    "connection refused", "no such host", "i/o timeout", "network is unreachable", "no route to host",
    "connection reset", "tls handshake timeout",
)  # fmt: skip


def classify(message: str) -> str:
    """A failure's kind from its words (see PullResult)."""
    lowered = message.lower()
    if any(word in lowered for word in ("manifest unknown", "name unknown", "not known to registry", "manifest not found")):
        return "not-found"
    if "unauthorized" in lowered or "authentication required" in lowered or "denied" in lowered:
        return "unauthorized"
    if "http response to https client" in lowered:
        return "wrong-scheme"
    if "short-name" in lowered or "short name" in lowered:
        return "short-name"
    if any(word in lowered for word in _UNREACHABLE):
        return "unreachable"
    return "error"


def split_reference(reference: str) -> tuple[str | None, str]:
    """(registry host[:port] or None, repository path) of an image reference."""
    name = reference.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: len(name) - len(last)] + last.split(":", 1)[0]
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first, rest
    return None, name


_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_DOMAIN = rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:]+\])(?::[0-9]{{1,5}})?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REFERENCE = re.compile(
    rf"(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?"
)


def valid_reference(reference: str) -> bool:
    """Whether ``reference`` is a well-formed image reference (distribution's grammar:
    ``[registry[:port]/]path[:tag][@sha256:…]``, at most 255 characters of name)."""
    match = _REFERENCE.fullmatch(reference or "")
    return match is not None and len(reference.split("@", 1)[0].rsplit(":", 1)[0]) <= 255


def _refuse_short_name(reference: str) -> PullResult | None:
    """A reference must be well formed and name its registry: ``python:3`` is refused here,
    before any tool sees it (``docker://python:3`` would mean docker.io to skopeo whatever
    registries.conf says), and so is anything a tool could read as an option."""
    if not valid_reference(reference):
        return PullResult(False, None, f"invalid image reference {reference!r}", "invalid")
    registry, repository = split_reference(reference)
    if registry is not None and repository:
        return None
    return PullResult(
        False,
        None,
        f"short-name {reference!r} names no registry: write it in full (registry/repository:tag), "
        "short names are never looked up on a public registry",
        "short-name",
    )


def _tls_args(root: Path, reference: str) -> list[str]:
    registry, _ = split_reference(reference)
    return ["--tls-verify=false"] if registry in EngineConfig(root).local_registries() else []


def _local_digest(root: Path, reference: str, env: Mapping[str, str]) -> str | None:
    if "@sha256:" in reference:
        return reference.split("@", 1)[1]
    proc = subprocess.run(
        ["podman", "image", "inspect", "--format", "json", reference],
        env=dict(env), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if proc.returncode != 0:
        return None
    try:
        image = json.loads(proc.stdout)[0]
    except (ValueError, IndexError):
        return None
    registry, repository = split_reference(reference)
    name = f"{registry}/{repository}" if registry else repository
    digests = {entry.split("@", 1)[1] for entry in image.get("RepoDigests") or [] if entry.split("@", 1)[0] == name}
    if len(digests) == 1:
        return digests.pop()
    if not digests and image.get("Digest"):
        return image["Digest"]
    return None


def _run_streaming(
    argv: list[str], env: Mapping[str, str], timeout: float, progress: Callable[[str], None] | None
) -> tuple[int, str, str, bool]:
    """Runs argv, handing each stderr line to ``progress`` as it comes; kills its process group
    at ``timeout``. (returncode, stdout, stderr, timed_out)."""
    proc = subprocess.Popen(
        argv, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    out_chunks: list[bytes] = []
    err_lines: list[str] = []

    def read_out() -> None:
        out_chunks.append(proc.stdout.read())

    def read_err() -> None:
        for raw in proc.stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            if len(err_lines) < 10_000:
                err_lines.append(line)
            if progress is not None and line.strip():
                with contextlib.suppress(Exception):
                    progress(line)

    readers = [threading.Thread(target=read_out, daemon=True), threading.Thread(target=read_err, daemon=True)]
    for reader in readers:
        reader.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for reader in readers:
        reader.join(timeout=5)
    return proc.returncode, b"".join(out_chunks).decode(errors="replace"), "\n".join(err_lines), timed_out


# --------------------------------------------------------------------------------------------
# The default training image
# --------------------------------------------------------------------------------------------


def default_packages(pyproject: Path = REPO_DIR / "pyproject.toml") -> list[str]:
    """What pip installs into the default image: pyproject.toml's ``ckpt`` extra (the pinned CPU
    torch first) and numpy, pyyaml."""
    import tomllib

    extras = tomllib.loads(Path(pyproject).read_text())["project"]["optional-dependencies"]["ckpt"]
    wanted = [*extras, *(name for name in EXTRA_PIP if not any(_pip_name(e) == name for e in extras))]
    return sorted(wanted, key=lambda spec: _pip_name(spec) != "torch")


def default_reference(registry: str, packages: Iterable[str] | None = None) -> str:
    """``<registry>/satrain/default:<tag>``: the tag names the torch pin and a hash of the whole
    recipe, so a change of the recipe builds a new image instead of reusing a stale one."""
    packages = list(packages) if packages is not None else default_packages()
    torch = next((spec.split("==", 1)[1] for spec in packages if _pip_name(spec) == "torch" and "==" in spec), "any")
    recipe = json.dumps([RECIPE_VERSION, DEFAULT_SUITE, DEFAULT_DEBS, DPKG_EXCLUDES, sorted(packages)])
    digest = hashlib.sha256(recipe.encode()).hexdigest()[:10]
    return f"{registry}/{DEFAULT_REPOSITORY}:{DEFAULT_SUITE}-torch{torch}-{digest}"


def build_default_image(
    root: Path,
    registry: str,
    reference: str | None = None,
    log: Callable[[str], None] = print,
    *,
    packages: Iterable[str] | None = None,
    debs: Iterable[str] = DEFAULT_DEBS,
    suite: str = DEFAULT_SUITE,
    mirrors: Iterable[str] = DEFAULT_MIRRORS,
    python: str = sys.executable,
    verify: bool = True,
    force: bool = False,
) -> dict:
    """Builds the default training image and pushes it to ``registry`` (the local one), unless the
    registry already has ``reference`` (then it returns at once, ``cached`` True).

    Steps (their seconds are returned): ``bootstrap`` (mmdebstrap --variant=essential of
    bookworm with python3 into a directory), ``pip`` (the host's pip, so this machine's pip
    configuration and local torch wheel apply, installs ``packages`` into the rootfs's
    /usr/local/lib/python3.11/dist-packages; console scripts go to /usr/local/bin with
    ``#!/usr/bin/python3``), ``import`` (tar of the rootfs into ``podman import``), ``verify``
    (torch, transformers, accelerate import, torchrun --help, with no network), ``push``.
    Everything is built in a temporary directory under ``root/build``, removed afterwards.
    Returns {"reference", "digest", "cached", "seconds", "size"}."""
    root = Path(root).absolute()
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    packages = list(packages) if packages is not None else default_packages()
    reference = reference or default_reference(registry, packages)
    env = clean_env(root)
    build_root = root / "build"
    build_root.mkdir(mode=0o700, parents=True, exist_ok=True)
    with _locked(build_root / ".lock"):
        if not force:
            found = resolve_digest(root, reference)
            if found.ok:
                log(f"[image] {reference} is in the registry ({found.digest}): reusing it")
                size = image_size(root, reference)
                return {"reference": reference, "digest": found.digest, "cached": True, "seconds": {}, "size": size}
            if found.kind != "not-found":
                raise RuntimeError(f"cannot tell whether {reference} exists: {found.message}")
        missing = missing_tools(("mmdebstrap", "podman", "runc", "tar"))
        if missing:
            raise RuntimeError(
                f"cannot build the default image: {' and '.join(missing)} not installed "
                f"(as root: apt-get install {' '.join(missing)})"
            )
        version = subprocess.run(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True, check=True
        ).stdout.strip()
        if version != IMAGE_PYTHON:
            raise RuntimeError(f"the image's python is {IMAGE_PYTHON}; {python} is {version}, its wheels would not fit")
        seconds: dict[str, float] = {}
        work = Path(tempfile.mkdtemp(prefix="default-image-", dir=build_root))
        try:
            rootfs = work / "rootfs"
            step = time.monotonic()
            log(f"[image] bootstrap: mmdebstrap --variant=essential {suite} with {', '.join(debs)}")
            _check(
                [
                    "mmdebstrap", "--variant=essential", "--mode=auto", "--quiet",
                    f"--include={','.join(debs)}",
                    *(f"--dpkgopt={option}" for option in DPKG_EXCLUDES),
                    suite, str(rootfs), *mirrors,
                ],  # fmt: skip
                env={**env, "TMPDIR": str(work)},
                what="mmdebstrap",
                timeout=1800,
            )
            seconds["bootstrap"] = round(time.monotonic() - step, 1)
            log(f"[image] bootstrap: {seconds['bootstrap']} s")

            step = time.monotonic()
            site = rootfs / "usr" / "local" / "lib" / f"python{IMAGE_PYTHON}" / "dist-packages"
            log(f"[image] pip: {' '.join(packages)}")
            pip_tmp = work / "pip-tmp"
            pip_tmp.mkdir()
            _check(
                [python, "-m", "pip", "install", "--quiet", "--no-input", "--disable-pip-version-check",
                 "--no-warn-script-location", "--target", str(site), *packages],
                # The caller's environment on purpose: this machine's pip configuration (PIP_*).
                env={**os.environ, "TMPDIR": str(pip_tmp), "PIP_NO_INPUT": "1"},
                what="pip install",
                timeout=3600,
            )  # fmt: skip
            _finish_rootfs(rootfs, site)
            shutil.rmtree(pip_tmp, ignore_errors=True)
            seconds["pip"] = round(time.monotonic() - step, 1)
            log(f"[image] pip: {seconds['pip']} s")

            step = time.monotonic()
            changes = [
                f"ENV PATH={IMAGE_PATH_ENV}",
                "ENV LANG=C.UTF-8",
                'CMD ["bash"]',
                f"LABEL org.opencontainers.image.title=satrain-default",
                f"LABEL org.opencontainers.image.description=Debian {suite}, python3, {' '.join(packages)}",
            ]
            # The rootfs streams from tar into podman import: no multi-GB archive on disk.
            _import_directory(rootfs, reference, changes, env)
            shutil.rmtree(rootfs)
            seconds["import"] = round(time.monotonic() - step, 1)
            log(f"[image] import: {seconds['import']} s")

            if verify:
                step = time.monotonic()
                out = verify_image(root, reference)
                seconds["verify"] = round(time.monotonic() - step, 1)
                log(f"[image] verify: {out} ({seconds['verify']} s)")

            step = time.monotonic()
            digest_file = work / "digest"
            _check(
                ["podman", "push", "--quiet", *_tls_args(root, reference), "--digestfile", str(digest_file), reference],
                env=env,
                what="podman push",
                timeout=1800,
            )
            digest = digest_file.read_text().strip()
            seconds["push"] = round(time.monotonic() - step, 1)
            log(f"[image] push: {seconds['push']} s")
        finally:
            shutil.rmtree(work, ignore_errors=True)
        size = image_size(root, reference)
        total = round(sum(seconds.values()), 1)
        log(f"[image] built {reference} ({digest}) in {total} s: {seconds}; size {size}")
        return {"reference": reference, "digest": digest, "cached": False, "seconds": seconds, "size": size}


def verify_image(root: Path, reference: str, *, timeout: float = 300.0) -> str:
    """Runs the image with no network: torch, transformers and accelerate import, torchrun and
    accelerate answer --help. Returns torch's version; raises RuntimeError otherwise."""
    env = clean_env(Path(root).absolute())
    script = (
        "set -e; python -c 'import torch, transformers, accelerate, safetensors, numpy, yaml; print(torch.__version__)'; "
        "torchrun --help >/dev/null; accelerate --help >/dev/null"
    )
    proc = _check(
        ["podman", "run", "--rm", "--network=none", "--pull=never", reference, "bash", "-c", script],
        env=env,
        what="the image check",
        timeout=timeout,
    )
    return proc.stdout.strip().splitlines()[-1]


def image_size(root: Path, reference: str) -> dict[str, int]:
    """{"uncompressed": bytes in local storage, "compressed": bytes of the layers in the
    registry} (either is left out when unknown)."""
    root = Path(root).absolute()
    env = clean_env(root)
    size: dict[str, int] = {}
    proc = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Size}}", reference], env=env, capture_output=True, text=True
    )
    if proc.returncode == 0 and proc.stdout.strip().isdigit():
        size["uncompressed"] = int(proc.stdout.strip())
    proc = subprocess.run(
        ["skopeo", "inspect", "--raw", *_tls_args(root, reference),
         "--authfile", str(EngineConfig(root).no_auth_file), f"docker://{reference}"],
        env=env,
        capture_output=True,
    )
    if proc.returncode == 0:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            size["compressed"] = sum(layer["size"] for layer in json.loads(proc.stdout)["layers"])
    return size


def _import_directory(
    rootfs: Path, reference: str, changes: list[str], env: Mapping[str, str], timeout: float = 1800
) -> None:
    tar = subprocess.Popen(
        ["tar", "--numeric-owner", "--xattrs", "-C", str(rootfs), "-cf", "-", "."],
        env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        importer = subprocess.run(
            ["podman", "import", "--quiet", *(arg for change in changes for arg in ("--change", change)), "-", reference],
            env=dict(env), stdin=tar.stdout, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
    finally:
        tar.stdout.close()
        tar_err = tar.stderr.read().decode(errors="replace")
        tar.stderr.close()
        try:
            tar.wait(timeout=60)
        except subprocess.TimeoutExpired:
            tar.kill()
            tar.wait()
    if tar.returncode != 0:
        raise RuntimeError(f"tar of the rootfs failed (exit status {tar.returncode}): {tar_err.strip()[-2000:]}")
    if importer.returncode != 0:
        raise RuntimeError(f"podman import failed (exit status {importer.returncode}): {importer.stderr.strip()[-2000:]}")


def _finish_rootfs(rootfs: Path, site: Path) -> None:
    """Console scripts to /usr/local/bin with ``#!/usr/bin/python3``; ``python`` is python3."""
    local_bin = rootfs / "usr" / "local" / "bin"
    local_bin.mkdir(parents=True, exist_ok=True)
    scripts = site / "bin"
    if scripts.is_dir():
        for script in sorted(scripts.iterdir()):
            target = local_bin / script.name
            if script.is_file() and not script.is_symlink():
                data = script.read_bytes()
                lines = data.split(b"\n")
                if lines and lines[0].startswith(b"#!") and b"python" in lines[0]:
                    lines[0] = b"#!/usr/bin/python3"
                elif len(lines) > 2 and lines[0] == b"#!/bin/sh" and lines[1].startswith(b"'''exec'"):
                    lines = [b"#!/usr/bin/python3", *lines[3:]]  # pip's trampoline for long interpreter paths
                target.write_bytes(b"\n".join(lines))
                target.chmod(0o755)
                script.unlink()
            else:
                shutil.move(str(script), str(target))
        shutil.rmtree(scripts, ignore_errors=True)
    python = local_bin / "python"
    if not python.exists():
        python.symlink_to("/usr/bin/python3")


def _check(argv: list[str], *, env: Mapping[str, str], what: str, timeout: float = 600) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(argv, env=dict(env), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{what} did not finish in {timeout:g} s") from exc
    if proc.returncode != 0:
        detail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"{what} failed (exit status {proc.returncode}):\n{detail}")
    return proc


def _alias_path(alias: str) -> str:
    path = re.sub(r"[^a-z0-9._/-]+", "-", alias.lower()).strip("-./") or "alias"
    return path.split(":", 1)[0]


def _pip_name(spec: str) -> str:
    return re.split(r"[<>=!~\[;@ ]", spec, maxsplit=1)[0].strip().lower().replace("_", "-")


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------


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


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def _shorten(text: str, limit: int = 500) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
