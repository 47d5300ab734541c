"""Importing a dependency without the parts of it an audit never uses.

pandera's top-level package imports pandas and pandera's whole pandas API whenever pandas is
installed (as it is beside Ray, datasets or moto), though the audit uses only pandera's polars
API: half a second of every process's start. pandera supports installs without pandas; hiding
pandas while pandera is first imported gives exactly that install's pandera, and pandas stays
importable for anything that wants it afterwards.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any


class _Hidden(importlib.abc.MetaPathFinder):
    """Makes `import NAME` fail as it does where NAME is not installed."""

    def __init__(self, names: tuple[str, ...]):
        self.names = names

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> None:
        root = fullname.partition(".")[0]
        if root in self.names:
            raise ModuleNotFoundError(f"No module named '{root}'", name=root)
        return None


@contextmanager
def hidden(*names: str) -> Iterator[None]:
    """While inside: `import NAME` raises as if NAME were not installed (unless already imported)."""
    absent = tuple(name for name in names if name not in sys.modules)
    finder = _Hidden(absent)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def pandera_polars() -> ModuleType:
    """`pandera.polars`, imported (the first time) without pandera's pandas API."""
    if "pandera.polars" not in sys.modules:
        with hidden("pandas"):
            importlib.import_module("pandera.polars")
    return sys.modules["pandera.polars"]
