"""Loading a process's config dataclass from flags, environment and `fencepost.toml`.

Precedence, highest first: command-line flags that were given, environment
variables ``FENCEPOST_<FIELD>``, the ``[<section>]`` table of ``fencepost.toml``
(or the file named by ``FENCEPOST_CONFIG``), then the dataclass defaults.

A renamed field keeps its old spelling at every level: the class attribute ``former_names``
(old -> new, see :mod:`election.local.member_config`) lets a flag, ``FENCEPOST_<OLD>``
variable or TOML key of the old name set the field, with a deprecation warning naming the new
one; where both spellings are given at one level, the new one wins.

Example::

    @dataclass
    class BookieConfig:
        data: str = "./bookie-data"
        def validate(self): ...

    config = load_settings(BookieConfig, "bookie", flags={"data": None})
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

from election import ElectionError

log = logging.getLogger(__name__)

T = TypeVar("T")
ENV_PREFIX = "FENCEPOST_"
DEFAULT_TOML = "fencepost.toml"


class SettingsError(ElectionError):
    """A configuration value is missing, malformed or out of range."""


def _coerce(name: str, raw: Any, kind: Any) -> Any:
    if kind in (int, float) and isinstance(raw, str):
        try:
            return kind(raw)
        except ValueError:
            raise SettingsError(f"{name} must be a number, got {raw!r}") from None
    if kind is bool and isinstance(raw, str):
        lowered = raw.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise SettingsError(f"{name} must be true or false, got {raw!r}")
    return raw


def _read_toml(path: Path, section: str) -> dict:
    if not path.exists():
        return {}
    try:
        with path.open("rb") as fh:
            doc = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"cannot read {path}: {exc}") from None
    table = doc.get(section, {})
    if not isinstance(table, dict):
        raise SettingsError(f"[{section}] in {path} is not a table")
    return table


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _renamed(
    values: Mapping[str, Any], former_names: Mapping[str, str], spell: Callable[[str], str], where: str = ""
) -> dict:
    """``values`` with each former name given replaced by its field's name, and a warning for each.

    ``spell`` writes a name as the user wrote it at that level (``--zk-session-timeout``).
    """
    out = dict(values)
    for old, new in former_names.items():
        if out.get(old) is None:
            continue
        value = out.pop(old)
        if out.get(new) is None:
            out[new] = value
            log.warning("%s%s is deprecated: use %s", spell(old), where, spell(new))
        else:
            log.warning("%s%s is deprecated and ignored: %s is also given", spell(old), where, spell(new))
    return out


def load_settings(
    cls: type[T],
    section: str,
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    toml_path: str | os.PathLike | None = None,
) -> T:
    """Build and validate a ``cls`` instance; see the module docstring for precedence."""
    env = os.environ if env is None else env
    path = Path(toml_path or env.get(ENV_PREFIX + "CONFIG") or DEFAULT_TOML)
    table = _read_toml(path, section)
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    former_names: Mapping[str, str] = getattr(cls, "former_names", {})
    unknown = set(table) - names - set(former_names)
    if unknown:
        raise SettingsError(f"unknown keys in [{section}] of {path}: {', '.join(sorted(unknown))}")
    flags = _renamed(flags or {}, former_names, _flag)
    env = _renamed(
        env, {ENV_PREFIX + o.upper(): ENV_PREFIX + n.upper() for o, n in former_names.items()}, str
    )
    table = _renamed(table, former_names, str, f" in [{section}] of {path}")
    values: dict[str, Any] = {}
    for name in names:
        kind = hints[name]
        # ``int | None`` (a types.UnionType) as well as ``Optional[int]``: coerce to the int.
        base = (
            typing.get_args(kind)[0] if typing.get_origin(kind) in (typing.Union, types.UnionType) else kind
        )
        if flags.get(name) is not None:
            values[name] = flags[name]
        elif ENV_PREFIX + name.upper() in env:
            values[name] = _coerce(ENV_PREFIX + name.upper(), env[ENV_PREFIX + name.upper()], base)
        elif name in table:
            values[name] = _coerce(f"{section}.{name}", table[name], base)
    config = cls(**values)
    validate = getattr(config, "validate", None)
    if validate is not None:
        validate()
    return config
