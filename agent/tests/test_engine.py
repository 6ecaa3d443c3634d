"""agent/engine.py against real Podman and real registries (Debian's docker-registry), as root.

Without podman, runc, skopeo or docker-registry (or not as root) these tests are skipped with the
reason; with REQUIRE_CONTAINERS=1 they fail instead. The image pulled is a tiny one (a single file,
``podman import``-ed and pushed to the test's registries), so the registry tests take seconds; the
default training image's test is marked ``slow`` and reuses the image already in the checkout's
registry (var/podman, port 5000) when it is there.
"""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from agent import engine

TOOLS = ("podman", "runc", "skopeo", "docker-registry")
REPO = Path(__file__).resolve().parents[2]


def _why_not_here() -> str | None:
    missing = engine.missing_tools(TOOLS)
    if missing:
        return f"{', '.join(missing)} not installed (as root: apt-get install {' '.join(missing)})"
    if os.geteuid() != 0:
        return f"the container engine runs as root and these tests run as uid {os.geteuid()}"
    return None


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """The engine's directory for this module (storage, configuration, registries)."""
    why = _why_not_here()
    if why is None:
        path = tmp_path_factory.mktemp("engine")
        ready, reason = engine.availability(path)
        why = None if ready else reason
        if why is None:
            yield path
            for name in ("registry", "private", "plain-http", "flaky"):
                engine.stop_registry(path, name=name)
            engine.unmount_storage(path)  # so pytest can remove the directory
            return
    if os.environ.get("REQUIRE_CONTAINERS") == "1":
        pytest.fail(f"REQUIRE_CONTAINERS=1 but containers cannot run here: {why}")
    pytest.skip(f"containers cannot run here: {why}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tiny_tarball(path: Path) -> Path:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        data = b"a tiny image for the engine's tests\n"
        info = tarfile.TarInfo("hello.txt")
        info.size, info.mtime = len(data), 1_700_000_000
        archive.addfile(info, io.BytesIO(data))
    path.write_bytes(buffer.getvalue())
    return path


def _podman(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], check=False, env=engine.clean_env(root), capture_output=True, text=True, timeout=120)


def _push(root: Path, source: str, destination: str, creds: str | None = None) -> str:
    """Pushes a local image; returns the digest the registry stored."""
    digest_file = root / "digest"
    args = ["push", "--quiet", "--tls-verify=false", "--digestfile", str(digest_file)]
    if creds:
        args += ["--creds", creds]
    proc = _podman(root, *args, source, f"docker://{destination}")
    assert proc.returncode == 0, proc.stderr
    return digest_file.read_text().strip()


@pytest.fixture(scope="module")
def registry(root):
    address = engine.ensure_registry(root, _free_port())
    yield address
    engine.stop_registry(root)


@pytest.fixture(scope="module")
def tiny(root, registry) -> tuple[str, str]:
    """(reference, digest) of a one-file image in the test registry."""
    reference = f"{registry}/test/tiny:1"
    proc = _podman(root, "import", "--quiet", str(_tiny_tarball(root / "tiny.tar")), reference)
    assert proc.returncode == 0, proc.stderr
    return reference, _push(root, reference, reference)


@pytest.fixture(scope="module")
def private(root, tiny) -> tuple[str, Path]:
    """(reference, auth file) of the tiny image in a second registry that wants a password."""
    htpasswd = engine.write_htpasswd(root / "private" / "htpasswd", {"alice": "correct horse"})
    address = engine.ensure_registry(root, _free_port(), name="private", htpasswd=htpasswd)
    reference = f"{address}/team/tiny:1"
    _push(root, tiny[0], reference, creds="alice:correct horse")
    auth_file = engine.write_auth_file(root / "auth" / "alice.json", {address: ("alice", "correct horse")})
    yield reference, auth_file
    engine.stop_registry(root, name="private")


# ----------------------------------------------------------------------------------------------
# Without Podman: the message extraction and the small parts
# ----------------------------------------------------------------------------------------------


def test_the_registry_s_own_words_are_taken_from_podman_s_stderr():
    stderr = (
        "Trying to pull 127.0.0.1:5000/test/tiny:missing...\n"
        "Error: initializing source docker://127.0.0.1:5000/test/tiny:missing: reading manifest missing in "
        "127.0.0.1:5000/test/tiny: manifest unknown: manifest unknown\n"
    )
    message = engine.registry_message(stderr)
    assert message.startswith("initializing source docker://127.0.0.1:5000/test/tiny:missing")
    assert message.endswith("manifest unknown: manifest unknown")
    assert engine.classify(message) == "not-found"
    skopeo = (
        'time="2026-12-01T19:45:00Z" level=fatal msg="Error parsing image name \\"docker://127.0.0.1:5001/x:1\\": '
        'reading manifest 1 in 127.0.0.1:5001/x: unauthorized: authentication required"\n'
    )
    assert engine.registry_message(skopeo) == "reading manifest 1 in 127.0.0.1:5001/x: unauthorized: authentication required"
    several = "Error: 2 errors occurred:\n\t* first: connection refused\n\t* second: connection refused\n"
    assert engine.registry_message(several) == "first: connection refused; second: connection refused"
    assert engine.classify('Get "https://127.0.0.1:1/v2/": http: server gave HTTP response to HTTPS client') == "wrong-scheme"
    assert engine.classify("dial tcp 127.0.0.1:1: connect: connection refused") == "unreachable"


def test_references_are_split_into_registry_and_repository():
    assert engine.split_reference("127.0.0.1:5000/satrain/default:tag") == ("127.0.0.1:5000", "satrain/default")
    assert engine.split_reference("nvcr.io/nvidia/pytorch@sha256:" + "0" * 64) == ("nvcr.io", "nvidia/pytorch")
    assert engine.split_reference("localhost/x") == ("localhost", "x")
    assert engine.split_reference("python:3") == (None, "python")
    assert engine.split_reference("library/python") == (None, "library/python")


def test_a_short_name_or_a_malformed_reference_is_refused_before_any_tool_sees_it(tmp_path):
    result = engine.pull(tmp_path, "python:3")
    assert not result.ok and result.kind == "short-name" and "names no registry" in result.message
    assert engine.resolve_digest(tmp_path, "ubuntu").kind == "short-name"
    for bad in ("--authfile=/etc/shadow", "-x.io/y", "reg.io/a b", "reg.io/Upper", "reg.io/a:t@sha256:short", ""):
        assert engine.pull(tmp_path, bad).kind == "invalid", bad
    assert engine.valid_reference("nvcr.io/nvidia/pytorch:24.01-py3")
    assert engine.valid_reference("127.0.0.1:5000/a/b@sha256:" + "0" * 64)


def test_htpasswd_is_bcrypt_and_auth_files_are_private(tmp_path):
    htpasswd = engine.write_htpasswd(tmp_path / "htpasswd", {"alice": "pw"})
    user, hashed = htpasswd.read_text().strip().split(":", 1)
    assert user == "alice" and hashed.startswith("$2")
    auth = engine.write_auth_file(tmp_path / "auth.json", {"127.0.0.1:5001": ("alice", "pw")})
    assert auth.stat().st_mode & 0o777 == 0o600 and htpasswd.stat().st_mode & 0o777 == 0o600
    assert json.loads(auth.read_text()) == {"auths": {"127.0.0.1:5001": {"auth": "YWxpY2U6cHc="}}}


def test_the_default_image_installs_what_pyproject_pins():
    packages = engine.default_packages()
    assert packages[0] == "torch==2.13.0"
    for name in ("transformers", "accelerate", "safetensors", "datasets", "numpy", "pyyaml"):
        assert any(spec.startswith(name) for spec in packages), name
    reference = engine.default_reference("127.0.0.1:5000")
    assert reference.startswith("127.0.0.1:5000/satrain/default:bookworm-torch2.13.0-")
    assert engine.default_reference("127.0.0.1:5000", [*packages, "rich"]) != reference


# ----------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------


@pytest.mark.slow  # real registries, Podman and ports
def test_configuration_is_written_once_and_names_only_our_files(root, registry, monkeypatch):
    env = engine.podman_env(root)
    files = [Path(env[key]) for key in ("CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF", "CONTAINERS_REGISTRIES_CONF")]
    assert all(path.parent == root and path.is_file() for path in files)
    before = [path.stat().st_mtime_ns for path in files]
    engine.podman_env(root)
    assert [path.stat().st_mtime_ns for path in files] == before  # idempotent
    containers = files[0].read_text()
    assert 'runtime = "runc"' in containers and 'cgroup_manager = "cgroupfs"' in containers and "@ROOT@" not in containers
    assert f'graphroot = "{root}/storage"' in files[1].read_text()
    registries = files[2].read_text()
    settings = "\n".join(line for line in registries.splitlines() if not line.startswith("#"))
    assert "unqualified-search-registries = []" in settings and "docker.io" not in settings
    assert f'location = "{registry}"\ninsecure = true' in registries
    # Nothing of the caller's environment reaches a tool run as root.
    monkeypatch.setenv("GCONV_PATH", "/tmp/evil")
    monkeypatch.setenv("REGISTRY_HTTP_ADDR", "0.0.0.0:5000")
    clean = engine.clean_env(root)
    assert "GCONV_PATH" not in clean and "REGISTRY_HTTP_ADDR" not in clean and clean["HOME"].startswith(str(root))
    assert engine.podman_argv(root)[:2] == ["/usr/bin/env", "-i"]


@pytest.mark.slow  # podman processes (engine.availability)
def test_availability_says_podman_runs_with_runc(root):
    ready, why = engine.availability(root)
    assert ready and "runc" in why
    assert engine.availability(root) == (ready, why)  # cached


@pytest.mark.slow  # real registries, Podman and ports
def test_podman_itself_never_takes_a_short_name_to_docker_io(root):
    """Podman reads /etc/containers/registries.conf.d's aliases whatever CONTAINERS_REGISTRIES_CONF
    says; ours point every one of them at a name that cannot resolve."""
    for name in ("python:3", "ubuntu", "no-such-alias"):
        proc = _podman(root, "pull", name)
        assert proc.returncode != 0
        assert "docker.io" not in proc.stderr and "quay.io" not in proc.stderr, proc.stderr
        assert engine.REFUSED_ALIAS_HOST in proc.stderr or "did not resolve to an alias" in proc.stderr, proc.stderr


# ----------------------------------------------------------------------------------------------
# The registry and pulls
# ----------------------------------------------------------------------------------------------


@pytest.mark.slow  # real registries, Podman and ports
def test_the_registry_answers_on_loopback_and_is_reused(root, registry):
    assert registry.startswith("127.0.0.1:") and engine.registry_answers(registry)
    pid = (root / "registry" / "registry.pid").read_text().strip()
    assert f"addr: {registry}\n" in (root / "registry" / "config.yml").read_text()
    assert engine.ensure_registry(root, int(registry.rsplit(":", 1)[1])) == registry
    assert (root / "registry" / "registry.pid").read_text().strip() == pid  # the same process: reused
    # Its storage is ours.
    assert (root / "registry" / "data").is_dir()


@pytest.mark.slow  # real registries, Podman and ports
def test_a_pull_reports_the_digest_the_registry_holds(root, tiny):
    reference, pushed = tiny
    lines: list[str] = []
    result = engine.pull(root, reference, progress=lines.append)
    assert result.ok, result.message
    assert result.digest == pushed and result.kind == ""
    assert engine.resolve_digest(root, reference).digest == pushed
    assert any(line.startswith("Trying to pull") for line in lines)
    # By digest, too.
    repository = reference.rsplit(":", 1)[0]
    assert engine.pull(root, f"{repository}@{pushed}").digest == pushed


@pytest.mark.slow  # real registries, Podman and ports
def test_a_missing_tag_is_manifest_unknown(root, tiny):
    repository = tiny[0].rsplit(":", 1)[0]
    result = engine.pull(root, f"{repository}:no-such-tag")
    assert not result.ok and result.digest is None
    assert "manifest unknown" in result.message and result.kind == "not-found"
    assert "\n" not in result.message
    assert engine.resolve_digest(root, f"{repository}:no-such-tag").kind == "not-found"


@pytest.mark.slow  # real registries and pulls
def test_a_private_repository_wants_credentials(root, private, tmp_path):
    reference, auth_file = private
    result = engine.pull(root, reference)
    assert not result.ok and "unauthorized" in result.message and result.kind == "unauthorized"
    wrong = engine.write_auth_file(tmp_path / "wrong.json", {reference.split("/", 1)[0]: ("alice", "wrong")})
    assert engine.pull(root, reference, wrong).kind == "unauthorized"
    result = engine.pull(root, reference, auth_file)
    assert result.ok, result.message
    assert result.digest and result.digest.startswith("sha256:")
    assert engine.resolve_digest(root, reference, auth_file).digest == result.digest


@pytest.mark.slow  # real registries, Podman and ports
def test_a_plain_http_registry_not_marked_insecure_is_the_wrong_scheme(root, tiny):
    address = engine.ensure_registry(root, _free_port(), name="plain-http", insecure=False)
    try:
        assert address not in engine.EngineConfig(root).local_registries()
        result = engine.pull(root, f"{address}/test/tiny:1")
        assert not result.ok and "http: server gave HTTP response to HTTPS client" in result.message
        assert result.kind == "wrong-scheme"
    finally:
        engine.stop_registry(root, name="plain-http")


@pytest.mark.slow  # real registries and pulls
def test_a_stopped_registry_is_connection_refused_then_back(root, tiny):
    port = _free_port()
    address = engine.ensure_registry(root, port, name="flaky")
    reference = f"{address}/test/tiny:1"
    pushed = _push(root, tiny[0], reference)
    assert engine.stop_registry(root, name="flaky")
    assert not engine.registry_answers(address)
    assert not engine.stop_registry(root, name="flaky")  # already stopped
    result = engine.pull(root, reference)
    assert not result.ok and "connection refused" in result.message and result.kind == "unreachable"
    assert engine.ensure_registry(root, port, name="flaky") == address
    try:
        result = engine.pull(root, reference)
        assert result.ok and result.digest == pushed  # its storage outlived it
    finally:
        engine.stop_registry(root, name="flaky")


@pytest.mark.slow  # real registries and pulls
def test_a_registry_that_never_answers_is_cut_by_the_timeout(root):
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        engine.trust_local_registry(root, address)
        try:
            started = time.monotonic()
            result = engine.pull(root, f"{address}/test/tiny:1", timeout=3)
            assert time.monotonic() - started < 10
            assert not result.ok and result.kind == "timeout" and "did not finish in 3 s" in result.message
        finally:
            engine.untrust_local_registry(root, address)


@pytest.mark.slow  # real registries, Podman and ports
def test_a_port_taken_by_something_else_is_said_so(root):
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen(1)
        with pytest.raises(RuntimeError, match="not a registry"):
            engine.ensure_registry(root, other.getsockname()[1], name="taken", timeout=2)


# ----------------------------------------------------------------------------------------------
# The default training image
# ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_default_image_runs_torch_without_a_network():
    """Builds the default image on first use (minutes) in the checkout's engine directory
    (CONTAINER_ENGINE_ROOT, else var/podman; its registry on port 5000), reused afterwards."""
    why = _why_not_here() or (None if engine.missing_tools(("mmdebstrap",)) == [] else "mmdebstrap not installed")
    if why:
        if os.environ.get("REQUIRE_CONTAINERS") == "1":
            pytest.fail(f"REQUIRE_CONTAINERS=1 but {why}")
        pytest.skip(why)
    root = Path(os.environ.get("CONTAINER_ENGINE_ROOT", str(REPO / "var" / "podman")))
    address = engine.ensure_registry(root, int(os.environ.get("LOCAL_REGISTRY_PORT", engine.DEFAULT_PORT)))
    # What a build killed midway leaves (the next build, or the next look-up, removes it).
    (root / "build" / "default-image-killed" / "rootfs").mkdir(parents=True, exist_ok=True)
    built = engine.build_default_image(root, address, log=lambda line: None)
    assert built["digest"].startswith("sha256:")
    pulled = engine.pull(root, built["reference"])
    assert pulled.ok and pulled.digest == built["digest"], pulled.message
    assert engine.verify_image(root, built["reference"]) == "2.13.0+cpu"
    proc = _podman(
        root, "run", "--rm", "--network=none", "--pull=never", built["reference"],
        "bash", "-c", "command -v python torchrun accelerate; head -1 $(command -v torchrun); echo $LANG",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [
        "/usr/local/bin/python", "/usr/local/bin/torchrun", "/usr/local/bin/accelerate", "#!/usr/bin/python3", "C.UTF-8",
    ]  # fmt: skip
    assert not any((root / "build").glob("default-image-*")), "the build left its temporary directory"
