"""Which code produced a result: the commit recorded in every results file.

`FUSEDRESNET_GIT_COMMIT` wins when set: on a GPU host the tree is a copy whose `.git` may not
be the code that runs (a copied `.git` can name the commit a session started from), so the
command that starts the run names the commit. Otherwise `git rev-parse`, with `+dirty` when
tracked files differ from it; None outside a git checkout.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

from .spec import PACKAGE_ROOT


def git_commit(tree: Path = PACKAGE_ROOT) -> str | None:
    """The commit of the code in `tree` (the checkout this package runs from unless told), as the module
    docstring says."""
    if os.environ.get("FUSEDRESNET_GIT_COMMIT"):
        return os.environ["FUSEDRESNET_GIT_COMMIT"]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=tree, timeout=10)
        if out.returncode == 0:
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                   text=True, cwd=tree, timeout=10).stdout.strip()
            return out.stdout.strip() + ("+dirty" if dirty else "")
    return None


if __name__ == "__main__":   # the GPU-host scripts' device.txt: `python3 -m fusedresnet.backend.provenance`
    print(git_commit() or "commit unknown")
