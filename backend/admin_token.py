"""The token that guards Triton's admin APIs: from $FUSEDRESNET_ADMIN_TOKEN, a file, or a fresh secret."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from .spec import ADMIN_TOKEN_ENV, BUILD_DIR
from .triton_install import ServerError

DEFAULT_TOKEN_FILE = BUILD_DIR / "admin-token"


def read_or_create_token(token_file: Path | None = None) -> str:
    """$FUSEDRESNET_ADMIN_TOKEN, else the token in `token_file` (which must exist when given), else the one in
    build/admin-token, written there (mode 0600) with a random secret if it does not exist yet."""
    if os.environ.get(ADMIN_TOKEN_ENV):
        return os.environ[ADMIN_TOKEN_ENV]
    path = Path(token_file) if token_file else DEFAULT_TOKEN_FILE
    if path.is_file():
        token = path.read_text().strip()
        if token:
            return token
    if token_file:
        raise ServerError(f"admin token file {path} is missing or empty")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(32) + "\n")
    return path.read_text().strip()
