"""The platform talks to its own registry with credentials made once at set-up: a random
password in a 0600 file of the engine's directory (under the console's var/), never in the
registry's config or on a command line; every push, copy, pull and digest look-up uses it."""

from __future__ import annotations

import json
import stat
import subprocess

import pytest

from agent import engine
from agent.tests.registry_fixtures import push_tiny_image

pytestmark = pytest.mark.slow  # a real docker-registry and Podman


def test_the_platforms_password_is_made_once_and_kept_in_a_private_file(platform_registry):
    root, address = platform_registry.root, platform_registry.address
    user, password = engine.platform_credentials(root, address)
    assert user == engine.PLATFORM_USER and len(password) >= 40
    auth_file = engine.EngineConfig(root).platform_auth_file
    assert stat.S_IMODE(auth_file.stat().st_mode) == 0o600
    assert set(json.loads(auth_file.read_text())["auths"]) == {address}
    # Started again (a console restart): the same password, the registry reused.
    pid = (root / "registry" / "registry.pid").read_text()
    assert engine.ensure_registry(root, int(address.rsplit(":", 1)[1])) == address
    assert engine.platform_credentials(root, address) == (user, password)
    assert (root / "registry" / "registry.pid").read_text() == pid
    # The registry has only its bcrypt hash; the config names the htpasswd file, not the password.
    htpasswd = root / "registry" / "htpasswd"
    assert stat.S_IMODE(htpasswd.stat().st_mode) == 0o600
    assert htpasswd.read_text().startswith(f"{user}:$2") and password not in htpasswd.read_text()
    assert password not in (root / "registry" / "config.yml").read_text()


def test_the_platform_pushes_pulls_copies_and_looks_up_digests_with_its_credentials(platform_registry):
    root, reference = platform_registry.root, platform_registry.reference
    pulled = engine.pull(root, reference)
    assert pulled.ok and pulled.digest == platform_registry.digest, pulled.message
    assert engine.resolve_digest(root, reference).digest == platform_registry.digest
    copy = f"{platform_registry.address}/team/trainer:copied"
    subprocess.run([*engine.podman_argv(root, "skopeo"), "copy", "--quiet", "--src-tls-verify=false", "--dest-tls-verify=false",
                    f"docker://{reference}", f"docker://{copy}"], check=True, capture_output=True, timeout=120)  # fmt: skip
    assert engine.resolve_digest(root, copy).digest == platform_registry.digest
    assert push_tiny_image(root, f"{platform_registry.address}/team/trainer:v9", b"another\n").startswith("sha256:")


def test_a_pull_given_a_projects_auth_file_uses_the_platforms_for_the_platforms_registry(platform_registry, tmp_path):
    """Only the platform's user is in its registry's htpasswd: any other credential for it
    (an operator registered one by mistake) would fail every pull of the default image."""
    other = engine.write_auth_file(tmp_path / "project.json", {platform_registry.address: ("alice", "wrong")})
    pulled = engine.pull(platform_registry.root, platform_registry.reference, other)
    assert pulled.ok, pulled.message
    assert engine.auth_file_for(platform_registry.root, "registry.example.com/team/x:1", other) == other


def test_without_the_platforms_credentials_a_pull_is_unauthorized(platform_registry):
    no_auth = engine.EngineConfig(platform_registry.root).no_auth_file
    proc = subprocess.run(
        [*engine.podman_argv(platform_registry.root), "pull", "--tls-verify=false", "--authfile", str(no_auth), platform_registry.reference], check=False,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0
    assert engine.classify(engine.registry_message(proc.stderr)) == "unauthorized", proc.stderr
