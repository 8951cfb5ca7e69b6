"""fencepost's core distribution installed into a fresh virtualenv, without the network.

The wheel is built from this tree's files (tracked, or new and not ignored) (``pip wheel --no-build-isolation``: the
running virtualenv's setuptools and wheel) and installed into a new virtualenv with ``--no-deps``;
the core's requirements, read from the wheel, and theirs are linked from the running virtualenv
into one directory the new one sees through a ``.pth`` file. So the new virtualenv holds what
``pip install fencepost`` would install and nothing else: no PySpark, pyarrow or matplotlib.

Example::

    core = install_core(tmp_path)
    subprocess.run([str(core.fencepost), "--help"])
    core.size_bytes   # fencepost and its dependencies, as installed
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class CoreInstall:
    venv: Path
    wheel: Path
    distributions: tuple[str, ...]  # the dependencies linked in, by name
    size_bytes: int

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def fencepost(self) -> Path:
        return self.venv / "bin" / "fencepost"


def _run(*args: str | Path, cwd: Path | None = None) -> None:
    done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, timeout=300)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} failed:\n{done.stderr.decode()[-3000:]}")


def build_wheel(out: Path) -> Path:
    """The wheel of this tree's tracked files (a copy: the build leaves nothing in the repository)."""
    source = out / "source"
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    )
    for name in filter(None, listed.stdout.decode().split("\0")):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    dist = out / "dist"
    _run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "-w", dist, source)  # fmt: skip
    [wheel] = dist.glob("fencepost-*.whl")
    return wheel


def core_requirements(wheel: Path) -> list[Requirement]:
    """What ``pip install`` of ``wheel`` without extras requires (its METADATA's Requires-Dist)."""
    with zipfile.ZipFile(wheel) as archive:
        [name] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = archive.read(name).decode()
    requirements = [Requirement(line.split(":", 1)[1].strip()) for line in metadata.splitlines()
                    if line.startswith("Requires-Dist:")]  # fmt: skip
    return [r for r in requirements if r.marker is None or r.marker.evaluate({"extra": ""})]


def _closure(requirements: list[Requirement]) -> dict[str, importlib.metadata.Distribution]:
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = list(requirements)
    while todo:
        requirement = todo.pop()
        dist = importlib.metadata.distribution(requirement.name)
        key = dist.metadata["Name"].lower()
        if key in found:
            continue
        found[key] = dist
        for text in dist.requires or []:
            nested = Requirement(text)
            if nested.marker is None or nested.marker.evaluate({"extra": ""}):
                todo.append(nested)
    return found


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def install_core(root: Path) -> CoreInstall:
    """Build the wheel and install the core into ``root/venv`` (see the module docstring)."""
    wheel = build_wheel(root)
    venv = root / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    _run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "install",
        "--quiet",
        "--no-deps",
        "--no-index",
        wheel,
    )
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .strip()
    )
    deps = root / "deps"
    deps.mkdir()
    found = _closure(core_requirements(wheel))
    size = _tree_bytes(site)
    for dist in found.values():
        size += sum(f.size or 0 for f in dist.files or [])
        for top in {f.parts[0] for f in dist.files or [] if not f.parts[0].startswith("..")}:
            target = Path(dist.locate_file(top))
            if top != "__pycache__" and target.exists() and not (deps / top).exists():
                (deps / top).symlink_to(target)
    (site / "zz-core-dependencies.pth").write_text(f"{deps}\n")
    return CoreInstall(venv=venv, wheel=wheel, distributions=tuple(sorted(found)), size_bytes=size)
