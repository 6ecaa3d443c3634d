"""The default training image: mmdebstrap of Debian bookworm, the host's pip into its
dist-packages, ``podman import``, a check with no network, and a push to the local registry;
cached by a tag that hashes the recipe."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from agent.engine._util import _locked
from agent.engine.config import REPO_DIR, clean_env, missing_tools
from agent.engine.pulls import _tls_args, auth_file_for, resolve_digest

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


def default_packages(pyproject: Path = REPO_DIR / "pyproject.toml") -> list[str]:
    """What pip installs into the default image: pyproject.toml's ``ckpt`` extra (the pinned CPU
    torch first) and numpy, pyyaml."""

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
    (torch, transformers, accelerate import, torchrun --help, with no network), ``push`` (with the
    platform's credentials: ``ensure_registry`` started the registry behind them).
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
        # A build killed midway (its process, the console starting it, the machine) left its
        # directory, a rootfs of gigabytes: no build runs beside this one (the lock), so it goes.
        for stale in build_root.glob("default-image-*"):
            log(f"[image] removing {stale.name}, left by a build that did not finish")
            shutil.rmtree(stale, ignore_errors=True)
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
            raise RuntimeError(f"cannot build the default image: {' and '.join(missing)} not installed (as root: apt-get install {' '.join(missing)})")
        version = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True, check=True).stdout.strip()
        if version != IMAGE_PYTHON:
            raise RuntimeError(f"the image's python is {IMAGE_PYTHON}; {python} is {version}, its wheels would not fit")
        seconds: dict[str, float] = {}
        work = Path(tempfile.mkdtemp(prefix="default-image-", dir=build_root))
        progress = _Progress(log, step="bootstrap (1 of 5)")
        try:
            rootfs = work / "rootfs"
            step = time.monotonic()
            log(f"[image] bootstrap (1 of 5): mmdebstrap --variant=essential {suite} with {', '.join(debs)}")
            _check(
                [
                    "mmdebstrap",
                    "--variant=essential",
                    "--mode=auto",
                    "--quiet",
                    f"--include={','.join(debs)}",
                    *(f"--dpkgopt={option}" for option in DPKG_EXCLUDES),
                    suite,
                    str(rootfs),
                    *mirrors,
                ],
                env={**env, "TMPDIR": str(work)},
                what="mmdebstrap",
                timeout=1800,
            )
            seconds["bootstrap"] = round(time.monotonic() - step, 1)
            log(f"[image] bootstrap: {seconds['bootstrap']} s")

            step = time.monotonic()
            site = rootfs / "usr" / "local" / "lib" / f"python{IMAGE_PYTHON}" / "dist-packages"
            progress.at("pip (2 of 5)")
            log(f"[image] pip (2 of 5): {' '.join(packages)}")
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
                "LABEL org.opencontainers.image.title=satrain-default",
                f"LABEL org.opencontainers.image.description=Debian {suite}, python3, {' '.join(packages)}",
            ]
            progress.at("import (3 of 5)")
            # The rootfs streams from tar into podman import: no multi-GB archive on disk.
            _import_directory(rootfs, reference, changes, env)
            shutil.rmtree(rootfs)
            seconds["import"] = round(time.monotonic() - step, 1)
            log(f"[image] import: {seconds['import']} s")

            if verify:
                step = time.monotonic()
                progress.at("verify (4 of 5)")
                out = verify_image(root, reference)
                seconds["verify"] = round(time.monotonic() - step, 1)
                log(f"[image] verify: {out} ({seconds['verify']} s)")

            step = time.monotonic()
            progress.at("push (5 of 5)")
            digest_file = work / "digest"
            _check(
                [
                    "podman",
                    "push",
                    "--quiet",
                    # zstd, not gzip: every node's pull unpacks it faster (2-core VM, quiet: 26.4 →
                    # 19.8 s, 39 → 30 CPU-s) and it is 17 % smaller (397 vs 478 MB); the push
                    # itself barely changes (24.6 → 22.5 s). Podman ≥ 4 reads it.
                    "--compression-format=zstd",
                    *_tls_args(root, reference),
                    "--authfile",
                    str(auth_file_for(root, reference)),
                    "--digestfile",
                    str(digest_file),
                    reference,
                ],
                env=env,
                what="podman push",
                timeout=1800,
            )
            digest = digest_file.read_text().strip()
            seconds["push"] = round(time.monotonic() - step, 1)
            log(f"[image] push: {seconds['push']} s")
        finally:
            progress.stop()
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
    proc = subprocess.run(["podman", "image", "inspect", "--format", "{{.Size}}", reference], check=False, env=env, capture_output=True, text=True)
    if proc.returncode == 0 and proc.stdout.strip().isdigit():
        size["uncompressed"] = int(proc.stdout.strip())
    raw = subprocess.run(
        ["skopeo", "inspect", "--raw", *_tls_args(root, reference), "--authfile", str(auth_file_for(root, reference)), f"docker://{reference}"],
        check=False,
        env=env,
        capture_output=True,
    )
    if raw.returncode == 0:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            size["compressed"] = sum(layer["size"] for layer in json.loads(raw.stdout)["layers"])
    return size


def _import_directory(rootfs: Path, reference: str, changes: list[str], env: Mapping[str, str], timeout: float = 1800) -> None:
    tar = subprocess.Popen(
        ["tar", "--numeric-owner", "--xattrs", "-C", str(rootfs), "-cf", "-", "."],
        env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert tar.stdout is not None and tar.stderr is not None  # both are pipes
    try:
        importer = subprocess.run(
            ["podman", "import", "--quiet", *(arg for change in changes for arg in ("--change", change)), "-", reference], check=False,
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


PROGRESS_EVERY = 10.0  # seconds between the "still at it" lines of a long step


class _Progress:
    """Says ``[image] <step>: N s so far (M s in all)`` every PROGRESS_EVERY seconds while a
    build runs: a first build's long steps (minutes of pip, import, push) never look stuck."""

    def __init__(self, log: Callable[[str], None], step: str = "") -> None:
        self.log, self.step, self.started = log, step, time.monotonic()
        self.step_started = self.started
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.beat, name="image-progress", daemon=True)
        self.thread.start()

    def at(self, step: str) -> None:
        self.step, self.step_started = step, time.monotonic()

    def beat(self) -> None:
        while not self.done.wait(PROGRESS_EVERY):
            now = time.monotonic()
            self.log(f"[image] {self.step}: {now - self.step_started:.0f} s so far ({now - self.started:.0f} s in all)")

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


def _check(argv: list[str], *, env: Mapping[str, str], what: str, timeout: float = 600) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(argv, check=False, env=dict(env), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{what} did not finish in {timeout:g} s") from exc
    if proc.returncode != 0:
        detail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"{what} failed (exit status {proc.returncode}):\n{detail}")
    return proc


def _pip_name(spec: str) -> str:
    return re.split(r"[<>=!~\[;@ ]", spec, maxsplit=1)[0].strip().lower().replace("_", "-")
