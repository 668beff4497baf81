"""Files and directories the cache creates are private to the user who runs it (docs/security.md):
directories 0700, files 0600. What already exists is left as its owner made it."""

from __future__ import annotations

import os
from pathlib import Path

DIRECTORY_MODE = 0o700
FILE_MODE = 0o600


def make_private_dirs(path: Path) -> None:
    """Create ``path`` and any missing parents, each created one private (0700)."""
    missing = []
    for directory in [path, *path.parents]:
        if directory.exists():
            break
        missing.append(directory)
    for directory in reversed(missing):
        directory.mkdir(mode=DIRECTORY_MODE, exist_ok=True)
        os.chmod(directory, DIRECTORY_MODE)  # mkdir's mode is filtered by the umask


def make_private(path: Path) -> None:
    """Make a file this process just created private (0600)."""
    os.chmod(path, FILE_MODE)
