"""The previous version of fencepost, built from this repository's own history for the upgrade test.

``tests/upgrade/BASE`` names the base commit (the version a rolling upgrade starts from).
:func:`build_base` extracts that commit's tree and installs it, not editable, into a virtualenv
of its own, without the network: the new virtualenv sees the running one's site-packages after
its own (a ``.pth`` file), so the dependencies come from there and only fencepost's own modules
are the old ones. Old members then run as ``<venv>/bin/python -m cli ...``
(:attr:`BaseVersion.command`), from a directory outside the repository and without it on
PYTHONPATH (the harness's ``command`` option sees to both), so nothing of this tree shadows them.

Example::

    base = build_base(read_base(), tmp_path_factory.mktemp("base"))
    procs.start_bookie(cluster, command=base.command)
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import sysconfig
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.harness import REPO

BASE_FILE = Path(__file__).with_name("BASE")


@dataclass(frozen=True)
class BaseVersion:
    commit: str
    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def command(self) -> list[str]:
        """The command prefix that runs the base version's CLI (the harness's ``command``)."""
        return [str(self.python), "-m", "cli"]

    def script(self, path: Path) -> list[str]:
        """The command prefix that runs ``path`` with the base version's interpreter."""
        return [str(self.python), str(path)]


def read_base(path: Path = BASE_FILE) -> str:
    """The base commit's full hash: the one line of ``BASE`` that is not a comment."""
    lines = [line.strip() for line in path.read_text().splitlines()]
    hashes = [line for line in lines if line and not line.startswith("#")]
    if len(hashes) != 1:
        raise ValueError(f"{path.name} must name exactly one commit, found {hashes}")
    return hashes[0]


def _git(*args: str, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO), *args], stdout=stdout, stderr=subprocess.PIPE)


_built: dict[str, BaseVersion] = {}


def build_base(commit: str, root: Path) -> BaseVersion:
    """The base version installed in a virtualenv under ``root`` (once per commit and process).

    Fails the test (never skips) when the repository lacks the commit, e.g. a shallow clone.
    """
    if commit in _built:
        return _built[commit]
    if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        pytest.fail(
            f"the upgrade base {commit} (tests/upgrade/BASE) is not in this clone's history "
            "(a shallow clone? git fetch --unshallow)",
            pytrace=False,
        )
    tree, venv = root / "tree", root / "venv"
    archive = _git("archive", "--format=tar", commit)
    if archive.returncode != 0:
        raise AssertionError(f"git archive {commit}: {archive.stderr.decode()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tree, filter="data")
    # --without-pip: nothing to download or unpack; the running virtualenv's packages serve it.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    own = Path(_venv_path(python, "purelib"))
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    # A path line of a .pth is appended after the venv's own site-packages, so the old fencepost
    # installed there wins over the editable install of this tree that the running venv has (whose
    # own .pth hook is not run: only a site dir's .pth files are, and this adds a plain path).
    (own / "zz-dependencies.pth").write_text("".join(f"{path}\n" for path in ours))
    # Installed, not editable, by the base's own setup.cfg (its packages, modules and package data)
    # with setuptools' build_py into the venv's site-packages. Not `pip install --no-build-isolation`:
    # the setuptools a fresh virtualenv has needs the `wheel` package to build a wheel, which the
    # test dependencies do not include, and pip's build isolation would download setuptools.
    build = subprocess.run(
        [
            str(python),
            "-c",
            "from setuptools import setup; setup()",
            "--quiet",
            "build_py",
            "--build-lib",
            str(own),
        ],
        cwd=tree,
        capture_output=True,
    )
    if build.returncode != 0:
        raise AssertionError(f"installing the base version failed:\n{build.stderr.decode()[-3000:]}")
    where = subprocess.run(
        [
            str(python),
            "-c",
            "import cli; print(cli.__file__)",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        env={key: value for key, value in os.environ.items() if key != "PYTHONPATH"},
    )
    assert where.returncode == 0 and where.stdout.startswith(str(own)), (where.stdout, where.stderr)
    _built[commit] = BaseVersion(commit=commit, venv=venv)
    return _built[commit]


def _venv_path(python: Path, key: str) -> str:
    return subprocess.run(
        [str(python), "-c", f"import sysconfig; print(sysconfig.get_paths()[{key!r}])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
