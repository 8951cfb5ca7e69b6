"""The project's modules and the imports between them, read from the source (parsed, never imported)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Packages at the root that are not part of the code the layers describe.
NOT_LAYERED = ("tests",)


def _top_packages() -> tuple[str, ...]:
    return tuple(
        sorted(
            path.name
            for path in ROOT.iterdir()
            if path.is_dir() and (path / "__init__.py").exists() and path.name not in NOT_LAYERED
        )
    )


# Found on disk, so that a new package or top-level module is checked without being listed here.
PACKAGES = _top_packages()
TOP_MODULES = tuple(sorted(path.stem for path in ROOT.glob("*.py")))


def module_files() -> dict[str, Path]:
    """Every module of the project (every package at the root but tests/, every top-level module) by
    dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for name in TOP_MODULES:
        found[name] = ROOT / f"{name}.py"
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``name`` imports anywhere in its file, resolved to the deepest known module."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    targets: set[str] = set()

    def deepest(dotted: str) -> str | None:
        while dotted:
            if dotted in known:
                return dotted
            dotted = dotted.rpartition(".")[0]
        return None

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        candidates: list[str] = []
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # "from pkg import mod" imports the module pkg.mod when there is one.
            candidates = [f"{base}.{alias.name}" if base else alias.name for alias in node.names]
        for candidate in candidates:
            target = deepest(candidate)
            if target is not None and target != name:
                targets.add(target)
    return targets


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    known = set(files)
    return {name: imports_of(name, path, known) for name, path in files.items()}
