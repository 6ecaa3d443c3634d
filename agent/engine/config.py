"""Podman's configuration under the engine's root: containers.conf, storage.conf, registries.conf
(from the templates in deploy/podman/), the loopback registries marked insecure, the clean
environment every podman/skopeo run gets, and the unmounting of what Podman left mounted."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterable
from pathlib import Path

from agent.engine._util import _locked, _write_if_changed, read_auths

# The repository root (agent/engine/config.py is two folders down), as it was from agent/engine.py.
REPO_DIR = Path(__file__).resolve().parent.parent.parent
TEMPLATE_DIR = REPO_DIR / "deploy" / "podman"
SYSTEM_REGISTRIES_D = Path("/etc/containers/registries.conf.d")
REFUSED_ALIAS_HOST = "short-names-are-refused.invalid"
# A clean PATH for tools run as root: the caller's PATH is not trusted either.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


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
        """An auth file with no credentials (so root's own auth.json is never consulted)."""
        return self.root / "no-auth.json"

    @property
    def platform_auth_file(self) -> Path:
        """The platform's own credentials for the registries the engine started (a
        containers-auth.json, mode 0600; see ``registry.platform_credentials``): every
        podman/skopeo run of ``clean_env`` uses it (REGISTRY_AUTH_FILE), and a pull given no auth
        file too. It holds nothing but those loopback registries' entries."""
        return self.root / "platform-auth.json"

    def platform_registries(self) -> set[str]:
        """The registries (``127.0.0.1:<port>``) the platform's auth file has credentials for."""
        return set(self.platform_auths())

    def platform_auths(self) -> dict[str, dict]:
        """The platform's auth file's ``auths`` ({registry: {"auth": base64}})."""
        return read_auths(self.platform_auth_file)

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
        # Created once, never rewritten here: registry.platform_credentials adds to it, and a
        # concurrent write() must not put an empty file back over its credentials.
        with contextlib.suppress(FileExistsError):
            fd = os.open(self.platform_auth_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write('{"auths": {}}\n')
        for name in ("containers.conf", "storage.conf"):
            text = (self.template_dir / name).read_text().replace("@ROOT@", str(self.root))
            _write_if_changed(self.root / name, text)
        blocks = "\n".join(f'[[registry]]\nlocation = "{address}"\ninsecure = true\n' for address in self.local_registries())
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
            # The platform's credentials for its own registries (nothing else): a podman push or
            # skopeo copy run with this environment is the platform's, and may write there.
            "REGISTRY_AUTH_FILE": str(self.platform_auth_file),
        }


def podman_env(root: Path) -> dict[str, str]:
    """Writes (idempotently) root's containers.conf, storage.conf and registries.conf, and returns
    the variables that make podman/skopeo use them: CONTAINERS_CONF, CONTAINERS_STORAGE_CONF,
    CONTAINERS_REGISTRIES_CONF, HOME/XDG_CONFIG_HOME under root (Podman's per-user files), and
    REGISTRY_AUTH_FILE (the platform's credentials for its own registries). Prefer ``clean_env``
    (these plus a fixed PATH, nothing of the caller's environment)."""
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
        subprocess.run(["umount", "-l", point], check=False, env={"PATH": SYSTEM_PATH}, capture_output=True, timeout=30)
    return sorted(set(points), key=len, reverse=True)


def missing_tools(tools: Iterable[str] = ("podman", "runc", "skopeo", "docker-registry", "mmdebstrap")) -> list[str]:
    """Which of the engine's commands are not installed (Debian packages of the same names)."""
    return [tool for tool in tools if shutil.which(tool, path=SYSTEM_PATH) is None]


def _alias_path(alias: str) -> str:
    path = re.sub(r"[^a-z0-9._/-]+", "-", alias.lower()).strip("-./") or "alias"
    return path.split(":", 1)[0]
