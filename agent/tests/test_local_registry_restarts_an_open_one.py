"""A registry an earlier version started without credentials (the same engine directory, so the
same config path and pid file) is restarted with credentials the next time the platform
starts it: its images stay, anonymous writes stop."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from agent import engine
from agent.tests.registry_fixtures import PlatformRegistry, containers_unavailable
from harness.processes import free_port

pytestmark = pytest.mark.slow  # a real docker-registry and Podman

EARLIER_CONFIG = """\
# Written by agent/engine.py: a registry for the console, on loopback only.
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: "{data}"
  delete:
    enabled: true
  cache:
    blobdescriptor: inmemory
http:
  addr: 127.0.0.1:{port}
  secret: 0123456789abcdef
  headers:
    X-Content-Type-Options: [nosniff]
"""


def test_an_open_registry_left_by_an_earlier_version_is_restarted_with_credentials(tmp_path):
    why = containers_unavailable(tmp_path)
    if why:
        pytest.skip(f"containers cannot run here: {why}")
    root, port = tmp_path, free_port()
    home = root / "registry"
    (home / "data").mkdir(parents=True)
    config = home / "config.yml"
    config.write_text(EARLIER_CONFIG.format(data=home / "data", port=port))
    engine.trust_local_registry(root, f"127.0.0.1:{port}")
    # Started as the earlier version did: detached, its pid in registry.pid.
    started = subprocess.run(
        ["/bin/sh", "-c", 'exec </dev/null; docker-registry serve "$0" >>"$1" 2>&1 & echo $!', str(config), str(home / "registry.log")], check=False,
        capture_output=True, text=True, timeout=10, start_new_session=True,
    )  # fmt: skip
    earlier_pid = int(started.stdout)
    (home / "registry.pid").write_text(f"{earlier_pid}\n")
    try:
        open_registry = PlatformRegistry(root, f"127.0.0.1:{port}", "", "")
        _wait_until_it_answers(open_registry)
        assert open_registry.request("GET", "/v2/")[0] == 200  # anyone could write to it

        assert engine.ensure_registry(root, port) == f"127.0.0.1:{port}"

        assert int((home / "registry.pid").read_text()) != earlier_pid
        assert not _alive(earlier_pid)
        assert open_registry.request("POST", "/v2/team/trainer/blobs/uploads/")[0] == 401
        assert "enabled: false" in config.read_text() and "htpasswd" in config.read_text()
    finally:
        engine.stop_registry(root)
        if _alive(earlier_pid):
            subprocess.run(["kill", str(earlier_pid)], check=False)
        engine.unmount_storage(root)


def _wait_until_it_answers(registry: PlatformRegistry) -> None:
    deadline = time.monotonic() + 20
    while not engine.registry_answers(registry.address):
        assert time.monotonic() < deadline, (registry.root / "registry" / "registry.log").read_text()
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
