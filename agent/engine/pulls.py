"""Pulls and digests: Podman pulls and skopeo look-ups whose failures come back in the registry's
own words (``PullResult``), and the image reference grammar (short names are refused)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from agent.engine.config import EngineConfig, clean_env


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
    containers-auth.json, see ``write_auth_file``) is passed as ``--authfile``; without one, and
    always for the platform's own registries, the platform's auth file is (``auth_file_for``), so
    no credential lying around on the node is ever sent. ``progress``
    receives Podman's progress lines ("Trying to pull …", "Copying blob …") as they come.
    ``timeout`` bounds the whole pull (then ok=False, kind ``timeout``)."""
    started = time.monotonic()
    root = Path(root).absolute()
    refused = _refuse_short_name(reference)
    if refused is not None:
        return refused
    env = clean_env(root)
    auth = str(auth_file_for(root, reference, auth_file))
    argv = ["podman", "pull", *_tls_args(root, reference), "--authfile", auth, reference]
    rc, stdout, stderr, timed_out = _run_streaming(argv, env, timeout, progress)
    elapsed = time.monotonic() - started
    if timed_out:
        return PullResult(False, None, f"the pull of {reference} did not finish in {timeout:g} s", "timeout", None, elapsed)
    if rc != 0:
        message = registry_message(stderr) or f"podman pull exited with status {rc}"
        return PullResult(False, None, message, classify(message), None, elapsed)
    image_id = stdout.strip().splitlines()[-1] if stdout.strip() else None
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
        "--authfile", str(auth_file_for(root, reference, auth_file)), f"docker://{reference}",
    ]  # fmt: skip
    try:
        proc = subprocess.run(argv, check=False, env=clean_env(root), capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return PullResult(False, None, f"the registry did not answer for {reference} in {timeout:g} s", "timeout")
    elapsed = time.monotonic() - started
    if proc.returncode != 0:
        message = registry_message(proc.stderr.decode(errors="replace")) or f"skopeo exited with status {proc.returncode}"
        return PullResult(False, None, message, classify(message), None, elapsed)
    digest = "sha256:" + hashlib.sha256(proc.stdout).hexdigest()
    return PullResult(True, digest, f"{reference} is {digest[:19]}", "", None, elapsed)


def auth_file_for(root: Path, reference: str, auth_file: Path | None = None) -> Path:
    """The auth file a podman/skopeo call about ``reference`` gets: the platform's own (root's
    ``platform_auth_file``) for a registry the platform started, whose htpasswd knows no other
    user, and when none is given (it holds only those loopback registries' credentials); else
    ``auth_file`` (a project's credentials for another registry)."""
    config = EngineConfig(Path(root))
    registry, _ = split_reference(reference)
    if auth_file is None or registry in config.platform_registries():
        return config.platform_auth_file
    return Path(auth_file)


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
            text = text[:-1] if text.endswith('"') else text
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
        f"short-name {reference!r} names no registry: write it in full (registry/repository:tag), short names are never looked up on a public registry",
        "short-name",
    )


def _tls_args(root: Path, reference: str) -> list[str]:
    registry, _ = split_reference(reference)
    return ["--tls-verify=false"] if registry in EngineConfig(root).local_registries() else []


def _local_digest(root: Path, reference: str, env: Mapping[str, str]) -> str | None:
    if "@sha256:" in reference:
        return reference.split("@", 1)[1]
    proc = subprocess.run(
        ["podman", "image", "inspect", "--format", "json", reference], check=False,
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


def _run_streaming(argv: list[str], env: Mapping[str, str], timeout: float, progress: Callable[[str], None] | None) -> tuple[int, str, str, bool]:
    """Runs argv, handing each stderr line to ``progress`` as it comes; kills its process group
    at ``timeout``. (returncode, stdout, stderr, timed_out)."""
    proc = subprocess.Popen(argv, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    stdout, stderr = proc.stdout, proc.stderr
    assert stdout is not None and stderr is not None  # both are pipes
    out_chunks: list[bytes] = []
    err_lines: list[str] = []

    def read_out() -> None:
        out_chunks.append(stdout.read())

    def read_err() -> None:
        for raw in stderr:
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


def _shorten(text: str, limit: int = 500) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
