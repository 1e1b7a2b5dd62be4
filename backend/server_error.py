"""The launcher's one error, in a module of its own: the admin token's resolver (admin_token.py), which the clients
import too, raises it without importing the server's installation (triton_server/installation.py) or the launcher
(serve.py). Both of those import it from here and still name it
(`from fusedresnet.backend.triton_server.installation import ServerError`)."""

from __future__ import annotations


class ServerError(RuntimeError):
    """The server cannot be started, or did not become ready."""
