"""What a model repository holds for the launcher: its model entries and the project's C++ backends they name
(built where missing, lazily: a server without the A/B router neither imports nor builds it)."""


from __future__ import annotations

from pathlib import Path

from ..server_error import ServerError
from ..spec import (
    AB_ROUTER_BACKEND,
    model_config,
)


def repository_models(repository: Path) -> list[str]:
    """The model entries of a model repository: its folders with a config.pbtxt."""
    return sorted(path.parent.name for path in Path(repository).glob("*/config.pbtxt"))


def repository_backends(repository: Path) -> dict[str, Path]:
    """The project's own C++ backends that the entries of a model repository name (`backend:` in config.pbtxt),
    each built now where missing (or found prebuilt): {"fusedresnet_ab": the A/B router's library} when an entry is
    the router (backend/ab_router/build.py), else nothing, so a server without the router neither imports nor
    builds it. A config that does not parse is Triton's to report when it loads it."""
    from google.protobuf import text_format

    def backend_of(entry: str) -> str:
        try:
            return model_config(entry, repository).backend
        except text_format.ParseError:
            return ""

    if not any(backend_of(entry) == AB_ROUTER_BACKEND for entry in repository_models(repository)):
        return {}
    from ..ab_router import build as ab_router_build
    try:
        return {AB_ROUTER_BACKEND: ab_router_build.build()}
    except ab_router_build.RouterBuildError as error:
        raise ServerError(str(error)) from None

