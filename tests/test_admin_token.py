"""The admin token's one resolver (backend/admin_token.py), used by the launcher and every client: an explicit
token file wins over $FUSEDRESNET_ADMIN_TOKEN, which wins over build/admin-token."""

from __future__ import annotations

import pytest

from fusedresnet.backend import admin_token
from fusedresnet.backend.spec import ADMIN_TOKEN_ENV
from fusedresnet.backend.triton_server.installation import ServerError
from fusedresnet.client import shared_memory


@pytest.fixture
def default_file(tmp_path, monkeypatch):
    """build/admin-token moved into tmp_path (not written yet), the environment's token unset."""
    path = tmp_path / "build" / "admin-token"
    monkeypatch.setattr(admin_token, "DEFAULT_TOKEN_FILE", path)
    monkeypatch.delenv(ADMIN_TOKEN_ENV, raising=False)
    return path


def test_the_clients_and_the_launcher_resolve_the_token_with_one_function():
    assert shared_memory.read_admin_token is admin_token.read_admin_token


def test_an_explicit_token_file_wins_over_the_environment_and_the_default_file(default_file, tmp_path, monkeypatch):
    explicit = tmp_path / "explicit-token"
    explicit.write_text("from-the-file\n")
    default_file.parent.mkdir()
    default_file.write_text("from-build\n")
    monkeypatch.setenv(ADMIN_TOKEN_ENV, "from-the-environment")
    assert admin_token.read_admin_token(explicit) == "from-the-file"
    assert admin_token.read_or_create_token(explicit) == "from-the-file"
    assert admin_token.read_admin_token(str(explicit)) == "from-the-file"   # as argparse hands it over


def test_the_environment_wins_over_the_default_file_and_the_default_file_over_nothing(default_file, monkeypatch):
    assert admin_token.read_admin_token() is None                 # a client without a token
    created = admin_token.read_or_create_token()                    # the launcher writes one
    assert len(created) >= 32 and default_file.read_text().strip() == created
    assert admin_token.read_admin_token() == created == admin_token.read_or_create_token()
    monkeypatch.setenv(ADMIN_TOKEN_ENV, "from-the-environment")
    assert admin_token.read_admin_token() == "from-the-environment" == admin_token.read_or_create_token()
    assert default_file.read_text().strip() == created              # left as it was


@pytest.mark.parametrize("content", [None, "", "  \n"])
def test_an_explicit_token_file_that_is_missing_or_empty_is_an_error_naming_it(default_file, tmp_path, monkeypatch,
                                                                                content):
    explicit = tmp_path / "explicit-token"
    if content is not None:
        explicit.write_text(content)
    monkeypatch.setenv(ADMIN_TOKEN_ENV, "from-the-environment")   # never a silent fallback to it
    for resolve in (admin_token.read_admin_token, admin_token.read_or_create_token):
        with pytest.raises(ServerError, match=f"admin token file {explicit} is missing or empty"):
            resolve(explicit)
    assert not default_file.exists()
