"""Files and directories the cache creates are private to the user who runs it (docs/security.md):
directories 0700, files 0600. What already exists is left as its owner made it.

Run as root, the embedded cluster's server runs as the ``postgres`` OS user, which must pass
through the directories above its data directory (the cache's own ``.mtcache`` among them): a
directory created then is 0710 with the group ``postgres``, which may enter it but not list
it; the files in it stay 0600."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

DIRECTORY_MODE = 0o700
SERVER_PASSAGE_MODE = 0o710  # run as root: the embedded server's group may pass through
FILE_MODE = 0o600
SERVER_USER = "postgres"  # the OS user the embedded server runs as when mtcache runs as root


def make_private_dirs(path: Path) -> None:
    """Create ``path`` and any missing parents, each created one private (0700; run as root,
    0710 with the embedded server's group, `SERVER_PASSAGE_MODE`)."""
    missing = []
    for directory in [path, *path.parents]:
        if directory.exists():
            break
        missing.append(directory)
    group = _server_group()
    for directory in reversed(missing):
        directory.mkdir(mode=DIRECTORY_MODE, exist_ok=True)
        if group is None:
            os.chmod(directory, DIRECTORY_MODE)  # mkdir's mode is filtered by the umask
        else:
            os.chown(directory, -1, group)
            os.chmod(directory, SERVER_PASSAGE_MODE)


def _server_group() -> int | None:
    """The embedded server's group when this process runs as root (the server then runs as
    `SERVER_USER`), else None."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVER_USER).pw_gid
    except KeyError:
        return None


def make_private(path: Path) -> None:
    """Make a file this process just created private (0600)."""
    os.chmod(path, FILE_MODE)
