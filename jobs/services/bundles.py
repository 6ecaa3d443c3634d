"""Code bundles: a user's directory, uploaded as one archive, that a job's runs find unpacked in
their work directory (``/job/work``).

What comes in (a ``.tar``, ``.tar.gz`` or ``.zip``, from the form, the API or ``satrain jobs
create --code DIR``) is read member by member and packed again into the one form the nodes
unpack: a gzipped tar of regular files and directories, sorted, with plain modes (0644, or 0755
where the owner could execute) and no owner. Anything else is refused with its name: an absolute
path, ``..``, a link, a device, a name twice, more than ``CODE_BUNDLE_MAX_FILES`` entries or more
than ``CODE_BUNDLE_MAX_BYTES`` unpacked (counted as read, so a zip bomb stops at the limit). The
same content uploaded twice to a project is one bundle.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, BinaryIO

from django.conf import settings
from django.db import IntegrityError, transaction

from jobs.models import CodeBundle, Project

CHUNK = 1 << 20
UPLOAD_SLACK = 1 << 20  # an archive may be a little larger than what it holds (headers, a stored zip)
MAX_NAME_CHARS = 400


class BundleRefused(ValueError):
    """The upload is not a bundle this console keeps; the message says why (and which entry)."""


@dataclass(frozen=True)
class Packed:
    archive: bytes
    sha256: str
    files: int
    unpacked_size: int


def limits() -> tuple[int, int]:
    return settings.CODE_BUNDLE_MAX_BYTES, settings.CODE_BUNDLE_MAX_FILES


def human(size: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:,.0f} {unit}" if unit == "bytes" else f"{size:,.1f} {unit}"
        size /= 1024
    return f"{size:,.1f} GiB"


def clean_name(name: str) -> str:
    """A member's path as the bundle keeps it (``a/b.py``); BundleRefused where it would land
    outside the work directory or cannot be a file name."""
    shown = name[:80]
    if "\x00" in name or "\\" in name:
        raise BundleRefused(f"{shown!r}: a name may not hold a NUL or a backslash.")
    if name.startswith("/"):
        raise BundleRefused(f"{shown!r}: an absolute path; a bundle holds paths relative to its directory.")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise BundleRefused(f"{shown!r}: '..' would lead outside the job's work directory.")
    cleaned = "/".join(parts)
    if len(cleaned) > MAX_NAME_CHARS:
        raise BundleRefused(f"{shown!r}…: a path longer than {MAX_NAME_CHARS} characters.")
    return cleaned


@dataclass
class Member:
    name: str
    is_dir: bool
    executable: bool
    mtime: float
    stream: IO[bytes] | None


def tar_members(source: BinaryIO) -> Iterator[Member]:
    with tarfile.open(fileobj=source, mode="r:*") as archive:
        for info in archive:
            if info.isdir():
                yield Member(info.name, True, False, info.mtime, None)
            elif info.isreg():
                yield Member(info.name, False, bool(info.mode & 0o100), info.mtime, archive.extractfile(info))
            elif info.name.split("/")[-1] in ("", "pax_global_header") and info.type in (tarfile.XGLTYPE, tarfile.XHDTYPE):
                continue
            else:
                what = "a symbolic link" if info.issym() else "a hard link" if info.islnk() else "not a file or directory"
                raise BundleRefused(f"{info.name[:80]!r} is {what}: a bundle holds files and directories only.")


def zip_members(source: BinaryIO) -> Iterator[Member]:
    with zipfile.ZipFile(source) as archive:
        for info in archive.infolist():
            mode = info.external_attr >> 16
            if mode and (mode & 0o170000) == 0o120000:
                raise BundleRefused(f"{info.filename[:80]!r} is a symbolic link: a bundle holds files and directories only.")
            mtime = time.mktime((*info.date_time, 0, 0, -1))
            if info.is_dir():
                yield Member(info.filename, True, False, mtime, None)
            else:
                yield Member(info.filename, False, bool(mode & 0o100), mtime, archive.open(info))


def members_of(source: BinaryIO) -> Iterator[Member]:
    head = source.read(4)
    source.seek(0)
    if head.startswith(b"PK"):
        return zip_members(source)
    return tar_members(source)


def pack(source: BinaryIO) -> Packed:
    """The upload ``source`` (a seekable file) packed as a bundle; BundleRefused with the reason."""
    max_bytes, max_files = limits()
    out = io.BytesIO()
    seen: set[str] = set()
    total = files = 0
    try:
        # gzip's header time fixed: the same content is the same bytes, so one bundle (sha256).
        with (
            gzip.GzipFile(fileobj=out, mode="wb", compresslevel=6, mtime=0) as zipped,
            tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as packed,
        ):
            for member in members_of(source):
                name = clean_name(member.name)
                if not name:
                    continue
                if name in seen:
                    raise BundleRefused(f"{name[:80]!r} is in the archive twice.")
                seen.add(name)
                files += 1
                if files > max_files:
                    raise BundleRefused(f"More than {max_files:,} entries (CODE_BUNDLE_MAX_FILES): leave data and outputs out of the bundle.")
                info = tarfile.TarInfo(name)
                info.mtime = int(max(member.mtime, 0))
                if member.is_dir:
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    packed.addfile(info)
                    continue
                assert member.stream is not None
                data = io.BytesIO()
                while chunk := member.stream.read(CHUNK):
                    total += len(chunk)
                    if total > max_bytes:
                        raise BundleRefused(
                            f"The bundle is over its limit of {human(max_bytes)} unpacked (CODE_BUNDLE_MAX_BYTES); "
                            "leave data, checkpoints and outputs out (a .gitignore or .satrainignore does, with satrain)."
                        )
                    data.write(chunk)
                info.size, info.mode = data.tell(), 0o755 if member.executable else 0o644
                data.seek(0)
                packed.addfile(info, data)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError, UnicodeError) as exc:
        raise BundleRefused(f"Not a readable .tar, .tar.gz or .zip archive: {exc}") from None
    if files == 0:
        raise BundleRefused("The archive is empty: a bundle holds at least one file.")
    archive = out.getvalue()
    return Packed(archive, hashlib.sha256(archive).hexdigest(), files, total)


def store(source: BinaryIO, *, owner, project: Project, name: str = "") -> CodeBundle:
    """Pack ``source`` and keep it for ``project`` (the same content already kept there is that bundle)."""
    packed = pack(source)
    existing = CodeBundle.objects.filter(project=project, sha256=packed.sha256).first()
    if existing is not None:
        return existing
    try:
        with transaction.atomic():
            return CodeBundle.objects.create(
                owner=owner,
                project=project,
                sha256=packed.sha256,
                archive=packed.archive,
                size=len(packed.archive),
                unpacked_size=packed.unpacked_size,
                files=packed.files,
                source=name[:200],
            )
    except IntegrityError:
        return CodeBundle.objects.get(project=project, sha256=packed.sha256)


def usable_by(user):
    """The bundles ``user`` may see and start jobs with: their own and their projects' (all, for staff)."""
    bundles = CodeBundle.objects.defer("archive")
    if user.is_staff:
        return bundles
    return bundles.filter(project__in=Project.objects.filter(members=user).values("pk"))


def bundle_problem(bundle: CodeBundle | None, project: Project) -> str | None:
    """Why a job of ``project`` may not run ``bundle`` (None: it may)."""
    if bundle is not None and bundle.project_id != project.pk:
        return f"Code bundle {bundle.pk} belongs to project {bundle.project.name}, not {project.name}: upload it to this project."
    return None


def store_upload(upload, *, owner, project: Project) -> CodeBundle:
    """``store`` for an uploaded file (the form's, the API's): one larger than the limit allows
    is refused before it is read."""
    limit = settings.CODE_BUNDLE_MAX_BYTES
    if upload.size > limit + UPLOAD_SLACK:
        raise BundleRefused(f"The upload is {human(upload.size)}, over the limit of {human(limit)} (CODE_BUNDLE_MAX_BYTES).")
    return store(upload, owner=owner, project=project, name=upload.name or "")
