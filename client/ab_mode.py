"""Show or change the A/B router's mode on a running server, through Triton's model repository API.

    python -m fusedresnet.client.ab_mode                                  # the router's parameters now
    python -m fusedresnet.client.ab_mode --mode split --candidate-percent 5
    python -m fusedresnet.client.ab_mode --mode shadow --url 10.0.0.7:8000 --admin-token-file token

A change reloads `resnet18_ab` with its current configuration (GET /v2/models/resnet18_ab/config) and the given
parameters replaced (POST /v2/repository/models/resnet18_ab/load with the configuration in the body). Triton
reloads the router with it. The parameters are checked here first (backend/ab_router/config.py, as the router checks
them at load): a bad one is named and nothing is sent, since a configuration the router refuses at load has
crashed Triton 2.51 (after a few such loads, under CPU load). The load API is
an admin API: it takes the admin token ($FUSEDRESNET_ADMIN_TOKEN, --admin-token-file, else build/admin-token)
and a server of one Triton process per GPU in model control mode explicit (`python -m fusedresnet.backend.serve
--processes-per-gpu 1 -- --model-control-mode=explicit --load-model='*'`: behind a port shared by several processes a
call reaches one of them); in mode none, the launcher's default, edit model_repository/resnet18_ab/config.pbtxt and
restart instead (docs/AB_LIVE.md). A reload starts the router's counters afresh per instance where Triton drops
the old series.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

from fusedresnet.backend.ab_router.config import ConfigError, parse_router_config
from fusedresnet.backend.spec import AB_ROUTER_MODEL, ADMIN_TOKEN_HEADER, DEFAULT_HOST, DEFAULT_HTTP_PORT
from fusedresnet.client.shared_memory import read_admin_token

# The router's parameters a user changes (backend/ab_router/ab_router_backend/ab_router.cc: all of them, validated at
# load).
PARAMETERS = ("mode", "primary", "candidate", "candidate_percent", "shadow_timeout_ms", "shadow_max_in_flight",
              "disagreement_records")


class RouterConfigError(RuntimeError):
    """A change refused before it was sent (the message names the parameter), or a call the server refused."""


def _call(url: str, body: dict | None = None, headers: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})},
                                     method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            text = response.read().decode()
    except urllib.error.HTTPError as error:
        message = error.read().decode(errors="replace")
        raise RouterConfigError(json.loads(message).get("error", message) if message.startswith("{") else message) \
            from None
    return json.loads(text) if text else {}


def router_model_config(http_url: str, model: str = AB_ROUTER_MODEL) -> dict:
    """The router's model configuration as the server serves it now (Triton's JSON form)."""
    return _call(f"http://{http_url}/v2/models/{model}/config")


def router_config(http_url: str, model: str = AB_ROUTER_MODEL) -> dict[str, str]:
    """The router's parameters now: name -> value."""
    return {k: v["string_value"] for k, v in router_model_config(http_url, model).get("parameters", {}).items()}


def load_router_config(http_url: str, admin_token: str | None, model: str = AB_ROUTER_MODEL,
                       **parameters: str) -> dict[str, str]:
    """Reload the router with `parameters` replaced in its current configuration; its parameters afterwards."""
    config = router_model_config(http_url, model)
    for key, value in parameters.items():
        config.setdefault("parameters", {})[key] = {"string_value": str(value)}
    try:   # checked here first: a configuration the router refuses at load has crashed Triton 2.51
        parse_router_config(config)
    except ConfigError as error:
        raise RouterConfigError(f"{model}: {error} (not sent: the router serves on as it was)") from None
    headers = {ADMIN_TOKEN_HEADER: admin_token} if admin_token else {}
    _call(f"http://{http_url}/v2/repository/models/{model}/load", {"parameters": {"config": json.dumps(config)}},
          headers)
    return router_config(http_url, model)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=f"{DEFAULT_HOST}:{DEFAULT_HTTP_PORT}", help="the server's HTTP host:port")
    parser.add_argument("--model", default=AB_ROUTER_MODEL)
    parser.add_argument("--admin-token-file", type=Path)
    for name in PARAMETERS:
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name)
    args = parser.parse_args(argv)
    changes = {name: getattr(args, name) for name in PARAMETERS if getattr(args, name) is not None}
    try:
        if changes:
            parameters = load_router_config(args.url, read_admin_token(args.admin_token_file), args.model, **changes)
        else:
            parameters = router_config(args.url, args.model)
    except (RouterConfigError, OSError) as error:
        print(f"ab_mode: {error}", file=sys.stderr)
        return 1
    print(json.dumps(parameters, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
