"""The embedded default's images: the local registry on loopback and the default training image
in it, built on first use (``agent.engine.build_default_image``) and reused afterwards.

The base image is built under a tag that names its recipe (a change of the recipe builds a new
one). On top of it goes a thin layer with the documentation's examples (``/opt/examples``, and
``jobs.examples`` importable) and a ``.pth`` file that puts the mounted ckptlib on the image's
path (``import ckptlib`` works in every run); that image is tagged with a hash of its base and of
the files, then also with the name jobs use (``DEFAULT_IMAGE``, e.g. ``pytorch:2.13-py3.11``).
"""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from agent import engine
from agent.sandbox import CKPTLIB_ROOT

REPO = Path(__file__).resolve().parent.parent
SITE = "/usr/local/lib/python3.11/dist-packages"


def example_files() -> dict[str, bytes]:
    """What the examples layer holds: path in the image → content."""
    files: dict[str, bytes] = {
        "/opt/satrain/jobs/__init__.py": b"",
        f"{SITE}/satrain.pth": f"/opt/satrain\n{CKPTLIB_ROOT}\n".encode(),
    }
    for source in sorted((REPO / "jobs" / "examples").glob("*.py")):
        files[f"/opt/satrain/jobs/examples/{source.name}"] = source.read_bytes()
    for source in sorted((REPO / "examples").glob("*.py")):
        files[f"/opt/examples/{source.name}"] = source.read_bytes()
    return files


def with_examples(root: Path, base: str, base_digest: str, registry: str, log: Callable[[str], None]) -> str:
    """The base image plus the examples layer, in the registry (built when missing)."""
    files = example_files()
    recipe = hashlib.sha256(base_digest.encode() + b"".join(k.encode() + b"\0" + v for k, v in sorted(files.items()))).hexdigest()[:12]
    reference = f"{registry}/satrain/default-examples:{recipe}"
    if engine.resolve_digest(root, reference).ok:
        return reference
    started = time.monotonic()
    podman = engine.podman_argv(root)
    with tempfile.TemporaryDirectory(prefix="examples-", dir=root) as context:
        lines = [f"FROM {base}"]
        for index, (target, content) in enumerate(sorted(files.items())):
            (Path(context) / f"f{index}").write_bytes(content)
            lines.append(f"COPY f{index} {target}")
        (Path(context) / "Containerfile").write_text("\n".join(lines) + "\n")
        subprocess.run(
            [*podman, "build", "--quiet", "--network=none", "--pull=never", "-t", reference, "-f", str(Path(context) / "Containerfile"), context],
            check=True,
            capture_output=True,
            timeout=600,
        )
    auth = str(engine.auth_file_for(root, reference))  # the platform's: only it may write to the registry
    subprocess.run([*podman, "push", "--quiet", "--tls-verify=false", "--authfile", auth, reference], check=True, capture_output=True, timeout=600)
    log(f"examples layer {reference} built and pushed in {time.monotonic() - started:.1f} s")
    return reference


def ensure(root: Path, port: int, name: str, log: Callable[[str], None] = print) -> dict:
    """Start the local registry and make sure it holds the default image under ``name``
    (``127.0.0.1:<port>/<repository>:<tag>``). Returns the build's figures (``cached``: the base
    was there already) and ``seconds_total`` of the whole call.

    The registry wants the platform's credentials for every request and refuses deletes
    (``engine.ensure_registry``; one an earlier version started without them is restarted), so
    no job that reaches loopback can replace the image; every push, copy and pull here uses them."""
    started = time.monotonic()
    address = engine.ensure_registry(root, port)
    built = engine.build_default_image(root, address, log=log)
    pulled = engine.pull(root, built["reference"])
    if not pulled.ok:
        raise RuntimeError(f"the default image {built['reference']} cannot be pulled: {pulled.message}")
    source = with_examples(root, built["reference"], pulled.digest or "", address, log)
    target = f"{address}/{name}"
    want = engine.resolve_digest(root, source)
    have = engine.resolve_digest(root, target)
    if not have.ok or have.digest != want.digest:
        subprocess.run(
            [
                *engine.podman_argv(root, "skopeo"),
                "copy",
                "--quiet",
                "--src-tls-verify=false",
                "--dest-tls-verify=false",
                "--authfile",
                str(engine.auth_file_for(root, target)),
                f"docker://{source}",
                f"docker://{target}",
            ],
            check=True,
            capture_output=True,
            timeout=600,
        )
    return {**built, "examples": source, "alias": target, "seconds_total": time.monotonic() - started}
