"""Code in and results out: packing a directory as a code bundle (``jobs create --code DIR``) and
saving what a job wrote (``jobs download``).

A directory is packed as a gzipped tar of its files, leaving out ``.git/`` and what its
``.gitignore`` and ``.satrainignore`` files (at any depth) exclude, with the patterns gitignore
uses: ``#`` comments, ``!`` to include again, a trailing ``/`` for directories only, a ``/`` in
the pattern anchoring it to that file's directory, ``*``, ``?``, ``[…]`` and ``**``. Symbolic
links are left out (a bundle holds files and directories only) and named.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

IGNORE_FILES = (".gitignore", ".satrainignore")
ALWAYS_LEFT_OUT = {".git"}


@dataclass(frozen=True)
class Rule:
    base: str  # the directory holding the ignore file, relative ("" at the top)
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool


def glob_regex(pattern: str) -> str:
    """gitignore's glob as a regex over a "/"-separated path."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end == -1:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : end].replace("\\", "\\\\")
                out.append(f"[{'^' + body[1:] if body.startswith('!') else body}]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def parse_rules(text: str, base: str) -> list[Rule]:
    rules = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        line = line[1:] if negate else line
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        body = glob_regex(line.lstrip("/"))
        regex = re.compile(("" if anchored else "(?:.*/)?") + body + "$")
        rules.append(Rule(base, regex, negate, dir_only))
    return rules


def ignored(path: str, is_dir: bool, rules: list[Rule]) -> bool:
    """Whether ``path`` (relative to the top) is left out: the last rule that matches decides."""
    verdict = False
    for rule in rules:
        if rule.base and not path.startswith(rule.base + "/"):
            continue
        below = path[len(rule.base) + 1 :] if rule.base else path
        if rule.dir_only and not is_dir:
            continue
        if rule.regex.match(below):
            verdict = not rule.negate
    return verdict


@dataclass
class Packed:
    archive: bytes
    files: int = 0
    bytes: int = 0
    left_out: list[str] = field(default_factory=list)


class PackRefused(ValueError):
    pass


def pack_directory(top: Path, *, max_bytes: int = 100 * 2**20) -> Packed:
    """``top``'s files as a gzipped tar (what the ignore files leave out, and links, left out)."""
    if not top.is_dir():
        raise PackRefused(f"{top} is not a directory")
    buffer = io.BytesIO()
    packed = Packed(b"")
    rules: list[Rule] = []
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as archive:
        for here, dirs, names in os.walk(top):
            relative = os.path.relpath(here, top).replace(os.sep, "/")
            relative = "" if relative == "." else relative
            for ignore in IGNORE_FILES:
                source = Path(here) / ignore
                if source.is_file() and not source.is_symlink():
                    rules += parse_rules(source.read_text(errors="replace"), relative)
            kept = []
            for name in sorted(dirs):
                path = f"{relative}/{name}" if relative else name
                if name in ALWAYS_LEFT_OUT or ignored(path, True, rules):
                    continue
                if (Path(here) / name).is_symlink():
                    packed.left_out.append(f"{path} (a link)")
                    continue
                kept.append(name)
            dirs[:] = kept
            for name in sorted(names):
                path = f"{relative}/{name}" if relative else name
                full = Path(here) / name
                if ignored(path, False, rules):
                    continue
                if full.is_symlink() or not full.is_file():
                    packed.left_out.append(f"{path} (a link)" if full.is_symlink() else f"{path} (not a file)")
                    continue
                size = full.stat().st_size
                packed.bytes += size
                if packed.bytes > max_bytes:
                    raise PackRefused(
                        f"{top} holds more than {max_bytes / 2**20:.0f} MiB of files to send; leave data and outputs out with a .gitignore or .satrainignore"
                    )
                info = archive.gettarinfo(str(full), arcname=path)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                with open(full, "rb") as data:
                    archive.addfile(info, data)
                packed.files += 1
    if packed.files == 0:
        raise PackRefused(f"{top} has no file to send (after the ignore files)")
    packed.archive = buffer.getvalue()
    return packed


def save_download(stream: io.RawIOBase | io.BufferedIOBase, *, is_tar: bool, destination: Path) -> Path:
    """Write a download to ``destination``: a tar (one directory) has its contents unpacked into
    that directory unless the name ends with ``.tar``; a file is written there. Returns what was written."""
    if is_tar and destination.suffix != ".tar":
        destination.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=stream, mode="r|") as archive:
            for member in archive:
                names = member.name.split("/")
                if member.name.startswith("/") or ".." in names or not (member.isfile() or member.isdir()):
                    raise PackRefused(f"the download holds {member.name!r}, which is not a plain file or directory below it")
                # The archive holds one directory (what was asked for): its contents go to ``destination``.
                if len(names) == 1:
                    continue
                member.name = "/".join(names[1:])
                if hasattr(tarfile, "data_filter"):  # checked above; the data filter too where this Python has it
                    archive.extract(member, destination, set_attrs=False, filter="data")
                else:
                    archive.extract(member, destination, set_attrs=False)
        return destination
    destination.parent.mkdir(parents=True, exist_ok=True)
    with open(destination, "wb") as out:
        while chunk := stream.read(1 << 20):
            out.write(chunk)
    return destination


GIT_URL = re.compile(r"^(?:[a-z][a-z0-9+.-]*://|git@[^:/\s]+:)\S+$")


def is_git_url(code: str) -> bool:
    """``https://…``, ``ssh://…``, ``file://…`` or ``git@host:path``: a repository, not a directory."""
    return bool(GIT_URL.match(code))


def clone(url: str, revision: str | None, into: Path) -> str:
    """Clone ``url`` at ``revision`` (a branch, tag or commit; None: its default branch) into
    ``into``, here, with this machine's git and credentials, as SageMaker's git_config does; the
    bundle is then packed from it like a directory (its ``.git/`` left out). Returns the commit."""
    if revision is not None and (revision.startswith("-") or not revision.strip()):
        raise PackRefused(f"--code-rev {revision!r} is not a revision")
    git = ["git", "-c", "advice.detachedHead=false"]
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}

    def run(*args: str, cwd: Path | None = None) -> str:
        try:
            done = subprocess.run([*git, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PackRefused(f"git {args[0]} could not run: {exc}") from None
        if done.returncode != 0:
            raise PackRefused(f"git {args[0]} {url} failed: {(done.stderr or done.stdout).strip().splitlines()[-1:] or ['no message']}")
        return done.stdout.strip()

    run("clone", "--quiet", "--no-checkout", "--", url, str(into))
    commit = None
    for name in [revision, f"origin/{revision}"] if revision else ["HEAD"]:
        try:
            commit = run("rev-parse", "--verify", "--quiet", f"{name}^{{commit}}", cwd=into)
            break
        except PackRefused:
            continue
    if not commit:
        raise PackRefused(f"{url} has no branch, tag or commit {revision!r}")
    run("checkout", "--quiet", "--detach", commit, cwd=into)
    return commit
