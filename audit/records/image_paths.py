"""Where an image path named in data leads: inside its folder, or refused before it is opened.

The audit reads an `image_data` path relative to the data file's folder, the generator a
dataset's image path relative to the dataset's folder; both refuse, with the same reasons, a
path that leads out of it.
"""

from __future__ import annotations

import os
from pathlib import Path


def path_inside(folder: Path, entry: str, where: str, absolute: bool = False) -> Path | str:
    """`entry` (a path relative to `folder`) resolved, or why it is refused, never opened: it
    cannot be resolved, or it leads out of `folder` (`where` names the folder in the reason):
    with `..`, as a symbolic link, or as an `absolute` path elsewhere. The audit's and the
    generator's image paths alike."""
    path = folder / entry
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError, ValueError):
        return "a path that cannot be resolved (a symlink loop?)"
    if resolved.is_relative_to(folder.resolve()):
        return resolved
    if absolute:
        return f"an absolute path outside {where}: refused, never opened; give a path relative to the folder"
    if Path(os.path.normpath(path)).is_relative_to(Path(os.path.normpath(folder))):
        return f"a symbolic link that leads outside {where}: refused, never opened; copy the image into the folder"
    return f"a path that leads outside {where}: refused, never opened"
