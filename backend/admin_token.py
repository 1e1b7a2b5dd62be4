"""The token that guards Triton's admin APIs: one resolver for the launcher and the clients.

Precedence, the same everywhere: an explicit token file (--admin-token-file) wins, then
$FUSEDRESNET_ADMIN_TOKEN, then build/admin-token. The launcher (`read_or_create_token`) writes a fresh
secret there when none is found; a client (`read_admin_token`) then has no token.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from .server_error import ServerError
from .spec import ADMIN_TOKEN_ENV, BUILD_DIR

DEFAULT_TOKEN_FILE = BUILD_DIR / "admin-token"


def read_admin_token(token_file: Path | str | None = None) -> str | None:
    """The admin token: the one in `token_file` when given (which must exist and hold one), else
    $FUSEDRESNET_ADMIN_TOKEN, else the one in build/admin-token when present, else None."""
    if token_file:
        path = Path(token_file)
        token = path.read_text().strip() if path.is_file() else ""
        if not token:
            raise ServerError(f"admin token file {path} is missing or empty")
        return token
    if os.environ.get(ADMIN_TOKEN_ENV):
        return os.environ[ADMIN_TOKEN_ENV]
    if DEFAULT_TOKEN_FILE.is_file():
        return DEFAULT_TOKEN_FILE.read_text().strip() or None
    return None


def read_or_create_token(token_file: Path | None = None) -> str:
    """`read_admin_token`, else a random secret written to build/admin-token (mode 0600) and returned."""
    token = read_admin_token(token_file)
    if token:
        return token
    DEFAULT_TOKEN_FILE.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(DEFAULT_TOKEN_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(32) + "\n")
    return DEFAULT_TOKEN_FILE.read_text().strip()
