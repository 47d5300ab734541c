"""Reading the project's data files (rule sets, profiles): TOML, strict about keys.

Every unknown key is rejected with the file and the dotted key named, so a typo in a
threshold can never silently turn a check off.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from audit.base.errors import ConfigError

# Built-in rule sets and profiles: `rules/` beside the package in a checkout, or the copy
# packed into the wheel as `audit/_rules`.
_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # audit/, this module's is audit/base/
BUILTIN_RULES_DIR = next(
    (p for p in (_PACKAGE_DIR.parent / "rules", _PACKAGE_DIR / "_rules") if p.is_dir()),
    _PACKAGE_DIR.parent / "rules",
)


def load_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file; a syntax error names the file and the line."""
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory; pass the .toml file itself") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}); a TOML file must be UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None


def reject_unknown(table: Mapping[str, Any], allowed: Iterable[str], where: str) -> None:
    """Raise a ConfigError naming the first key of `table` that is not in `allowed`."""
    allowed = set(allowed)
    for key in table:
        if key not in allowed:
            raise ConfigError(
                f"{where}: unknown key {key!r} (allowed: {', '.join(sorted(allowed))})"
            )


def expect(value: Any, kind: type | tuple[type, ...], where: str) -> Any:
    """Check the type of a configuration value, naming where it was found."""
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ConfigError(f"{where}: expected {names}, got {value!r}")
    return value


def string_list(value: Any, where: str) -> tuple[str, ...]:
    """A string or a list of strings, as a tuple."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ConfigError(f"{where}: expected a string or a list of strings, got {value!r}")
