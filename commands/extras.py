"""Which optional part of fencepost a command needs, checked before the command runs.

``pip install fencepost`` (the core) runs clients, workers, brokers and bookies. The extras add
the rest: ``fencepost[pipeline]`` PySpark, pyarrow, pandas and matplotlib (``export``, ``analyze``,
``audit``); ``fencepost[dev]`` what ``dev``, ``zk``, ``chaos`` and ``bench`` need (the ZooKeeper
server's jars, which come in PySpark's wheel, and hypothesis for fuzz runs). A command whose
extra is missing fails with one line naming it; its ``--help`` works without.

Example::

    require("pipeline", "fencepost analyze")
    # fencepost: fencepost analyze needs the pipeline extra (pyspark, pyarrow not installed):
    #   pip install 'fencepost[pipeline]'   (on one line)
"""

from __future__ import annotations

import importlib.util

from commands.errors import fail

# The modules each extra brings (setup.cfg, [options.extras_require]).
EXTRAS: dict[str, tuple[str, ...]] = {
    "pipeline": ("pyspark", "pyarrow", "pandas", "matplotlib"),
    "dev": ("pyspark", "hypothesis"),
}


def missing(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here."""
    return [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]


def require(extra: str, what: str) -> None:
    """Exit 1 with one line naming ``extra`` and how to install it, unless all its modules are here."""
    gone = missing(extra)
    if gone:
        fail(
            f"{what} needs the {extra} extra ({', '.join(gone)} not installed): "
            f"pip install 'fencepost[{extra}]'"
        )
