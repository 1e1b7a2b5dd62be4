"""The one way to start a server (backend/launcher/launch.py): the settings the command line parses into and renders
back (the subprocess form runs exactly the options a program chose), and what launch refuses before it starts
anything. The servers it starts are the other tests' (conftest.triton_server and the modules' own)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from fusedresnet.backend.serve import (
    LaunchedServer,
    ServerError,
    ServerGroup,
    ServerSettings,
    TritonServer,
    launch,
    main,
    parse_settings,
)

# Every option away from its default, and the arguments they are written as.
CHOSEN = ServerSettings(model_repository=Path("/srv/models"), host="0.0.0.0", http_port=9000, grpc_port=9001,
                        metrics_port=9002, processes_per_gpu=3, gpus="0,1", instances="gpu",
                        admin_token_file=Path("/run/token"), ready_timeout_s=12.5, exit_timeout_s=4,
                        log_file=Path("/tmp/server.log"), restart=False, mps="on", front_end="binary",
                        client_shared_memory=True, triton_args=["--log-verbose=1", "--exit-on-error=false"])
CHOSEN_ARGS = ["--host", "0.0.0.0", "--http-port", "9000", "--grpc-port", "9001", "--metrics-port", "9002",
               "--processes-per-gpu", "3", "--model-repository", "/srv/models", "--instances", "gpu",
               "--admin-token-file", "/run/token", "--ready-timeout", "12.5", "--exit-timeout", "4",
               "--log-file", "/tmp/server.log", "--gpus", "0,1", "--mps", "on", "--front-end", "binary",
               "--no-restart", "--client-shared-memory", "--", "--log-verbose=1", "--exit-on-error=false"]


def test_settings_render_as_the_command_line_that_parses_back_into_them():
    assert CHOSEN.cli_args() == CHOSEN_ARGS
    assert parse_settings(CHOSEN_ARGS) == CHOSEN


def test_default_settings_are_the_command_lines_defaults():
    assert ServerSettings().cli_args() == []
    default = parse_settings([])
    assert default == ServerSettings()
    assert (default.host, default.http_port, default.grpc_port, default.metrics_port) == ("127.0.0.1", 8000, 8001,
                                                                                            8002)
    assert (default.processes_per_gpu, default.mps, default.front_end, default.restart) == (None, "auto", None, True)


def test_the_admin_token_never_reaches_the_command_line():
    assert "s3cret" not in " ".join(ServerSettings(admin_token="s3cret").cli_args())
    assert ServerSettings(admin_token="s3cret").cli_args() == []


def test_mps_alone_on_the_command_line_is_on():
    assert parse_settings(["--mps"]).mps == "on"


def test_the_subprocess_form_runs_the_settings_on_free_ports(tmp_path):
    settings = ServerSettings(model_repository=Path("/srv/models"), processes_per_gpu=2, restart=False,
                              admin_token="s3cret")
    server = LaunchedServer(settings, tmp_path / "launcher.out")
    command = server.command()
    assert command[:3] == [sys.executable, "-m", "fusedresnet.backend.serve"]
    ports = {server.http_port, server.grpc_port, server.metrics_port}
    assert len(ports) == 3 and not ports & {8000, 8001, 8002}
    assert server.metrics_ports == [server.metrics_port, server.metrics_port + 1]
    assert parse_settings(command[3:]) == ServerSettings(
        model_repository=Path("/srv/models"), processes_per_gpu=2, restart=False, http_port=server.http_port,
        grpc_port=server.grpc_port, metrics_port=server.metrics_port, log_file=tmp_path / "launcher.log")
    assert "s3cret" not in " ".join(command) and server.admin_token == "s3cret"
    assert server.stop_timeout_s == 90


def test_launch_refuses_client_shared_memory_over_several_processes_before_it_starts_anything():
    with pytest.raises(ServerError, match="--client-shared-memory serves one process per GPU"):
        launch(ServerSettings(processes_per_gpu=2, client_shared_memory=True))


def test_the_command_line_says_so_and_exits_1(capsys):
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert main(["--processes-per-gpu", "2", "--client-shared-memory"]) == 1
    finally:
        for number, handler in handlers.items():     # main's own, for the launcher's process
            signal.signal(number, handler)
    assert capsys.readouterr().err == ("fusedresnet: --client-shared-memory serves one process per GPU: a region "
                                       "registered through one process is unknown to the others behind the shared "
                                       "port\n")


def test_a_groups_stop_closes_what_it_holds():
    closed = []
    group = ServerGroup([TritonServer(admin_token="t")])
    group.resources.callback(closed.append, "mps daemon")
    group.stop()
    group.stop()
    assert closed == ["mps daemon"]
