"""``satrain jobs create --code URL [--code-rev REV]``: a repository is cloned where satrain runs
(its git and credentials, as SageMaker's git_config), checked out at the branch, tag or commit
asked for, and packed like a directory without its ``.git/``; a revision it lacks is said."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest

pytest.importorskip("satrain", reason="the client is not installed: pip install -e ./client")

from satrain.files import PackRefused, clone, is_git_url, pack_directory

pytestmark = pytest.mark.slow  # runs git


def git(*args: str, cwd: Path) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.org",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.org",
        "PATH": "/usr/bin:/bin",
        "HOME": str(cwd),
    }
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repository(tmp_path) -> Path:
    repo = tmp_path / "project"
    repo.mkdir()
    git("init", "--quiet", "-b", "main", cwd=repo)
    (repo / "train.py").write_text("print('v1')\n")
    git("add", ".", cwd=repo)
    git("commit", "--quiet", "-m", "v1", cwd=repo)
    git("tag", "v1", cwd=repo)
    (repo / "train.py").write_text("print('v2')\n")
    (repo / "extra.py").write_text("x = 2\n")
    git("add", ".", cwd=repo)
    git("commit", "--quiet", "-m", "v2", cwd=repo)
    git("branch", "experiment", "v1", cwd=repo)
    return repo


def files_of(packed) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(packed.archive)) as archive:
        return {m.name: archive.extractfile(m).read() for m in archive if m.isfile()}


def test_a_repository_is_packed_at_the_revision_asked_for(repository, tmp_path):
    url = f"file://{repository}"
    assert is_git_url(url) and is_git_url("git@github.com:org/repo.git") and not is_git_url(str(repository))
    clone(url, None, tmp_path / "head")
    assert files_of(pack_directory(tmp_path / "head")) == {"train.py": b"print('v2')\n", "extra.py": b"x = 2\n"}
    commit = clone(url, "v1", tmp_path / "tagged")
    assert commit == git("rev-parse", "v1", cwd=repository)
    assert files_of(pack_directory(tmp_path / "tagged")) == {"train.py": b"print('v1')\n"}
    clone(url, "experiment", tmp_path / "branch")
    assert files_of(pack_directory(tmp_path / "branch")) == {"train.py": b"print('v1')\n"}
    with pytest.raises(PackRefused, match="has no branch, tag or commit 'nope'"):
        clone(url, "nope", tmp_path / "missing")
    with pytest.raises(PackRefused, match="git clone"):
        clone(f"file://{tmp_path}/no-such-repo", None, tmp_path / "gone")
