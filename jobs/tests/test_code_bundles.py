"""A code bundle keeps files and directories only, within the operator's limits, and is its
project's: what would land outside the work directory, a link, a device, a bomb or a name twice
is refused with its name; the same content twice is one bundle."""

from __future__ import annotations

import io
import tarfile
import zipfile

import pytest

from jobs.models import CodeBundle
from jobs.services.bundles import BundleRefused, bundle_problem, pack, store
from jobs.services.creation import personal_project_for

pytestmark = pytest.mark.django_db


def tar_of(*members: tuple[str, bytes | str | None], gz: bool = True) -> io.BytesIO:
    """A tar of (name, content): bytes a file, None a directory, a str a symlink to it."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz" if gz else "w") as archive:
        for name, content in members:
            info = tarfile.TarInfo(name)
            if content is None:
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            elif isinstance(content, str):
                info.type, info.linkname = tarfile.SYMTYPE, content
                archive.addfile(info)
            else:
                info.size = len(content)
                info.mode = 0o700
                archive.addfile(info, io.BytesIO(content))
    out.seek(0)
    return out


def unpacked(archive: bytes) -> dict[str, tuple[bytes | None, int]]:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as packed:
        return {m.name: (packed.extractfile(m).read() if m.isfile() else None, m.mode) for m in packed}


def test_a_directory_is_kept_as_files_and_directories_with_plain_modes():
    packed = pack(tar_of(("src", None), ("src/train.py", b"print('hi')\n"), ("./README", b"r")))
    assert unpacked(packed.archive) == {"src": (None, 0o755), "src/train.py": (b"print('hi')\n", 0o755), "README": (b"r", 0o755)}
    assert (packed.files, packed.unpacked_size) == (3, 13)


def test_a_zip_is_taken_too():
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("train.py", "print(1)\n")
        archive.writestr("conf/", "")
    out.seek(0)
    assert set(unpacked(pack(out).archive)) == {"train.py", "conf"}


@pytest.mark.parametrize(
    ("members", "said"),
    [
        ((("../escape.py", b"x"),), "'..' would lead outside"),
        ((("/etc/cron.d/x", b"x"),), "an absolute path"),
        ((("leak", "/etc/shadow"),), "is a symbolic link"),
        ((("a.py", b"1"), ("./a.py", b"2")), "in the archive twice"),
        ((), "The archive is empty"),
    ],
)
def test_what_would_land_outside_or_is_no_file_is_refused_by_name(members, said):
    with pytest.raises(BundleRefused, match=said):
        pack(tar_of(*members))


def test_a_bundle_over_the_limit_is_refused_while_read(settings):
    settings.CODE_BUNDLE_MAX_BYTES = 1 << 20
    # A zip bomb: 64 MiB of zeros in a few KiB; reading stops at the limit.
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("zeros.bin", b"\0" * (64 << 20))
    assert out.tell() < 200_000
    out.seek(0)
    with pytest.raises(BundleRefused, match=r"over its limit of 1\.0 MiB unpacked \(CODE_BUNDLE_MAX_BYTES\)"):
        pack(out)


def test_too_many_files_and_a_non_archive_are_refused(settings):
    settings.CODE_BUNDLE_MAX_FILES = 3
    with pytest.raises(BundleRefused, match=r"More than 3 entries"):
        pack(tar_of(*((f"f{i}", b"") for i in range(4))))
    with pytest.raises(BundleRefused, match=r"Not a readable \.tar, \.tar\.gz or \.zip archive"):
        pack(io.BytesIO(b"just some text, not an archive"))


def test_the_same_content_twice_is_one_bundle_of_its_project(owner, project, outsider):
    packed = pack(tar_of(("train.py", b"print(1)\n")))
    assert packed.sha256 == pack(tar_of(("train.py", b"print(1)\n"), gz=False)).sha256
    assert packed.archive[4:8] == b"\0\0\0\0"  # gzip's header time: none, so packing later gives the same bytes
    first = store(tar_of(("train.py", b"print(1)\n")), owner=owner, project=project, name="code.tar.gz")
    again = store(tar_of(("train.py", b"print(1)\n")), owner=owner, project=project, name="again.tar.gz")
    assert again.pk == first.pk and CodeBundle.objects.count() == 1
    elsewhere = personal_project_for(outsider)
    assert "belongs to project" in bundle_problem(first, elsewhere)
    assert bundle_problem(first, project) is None
