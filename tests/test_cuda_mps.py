"""CUDA MPS for the server's processes (backend/cuda_mps.py, the launcher's --mps): refused clearly where it
cannot run, its environment given to the server's processes only on a GPU, and a real daemon on a GPU host."""

from __future__ import annotations

import contextlib
import shutil

import pytest

from fusedresnet.backend import serve
from fusedresnet.backend.cuda_mps import MPS_CONTROL, MpsError, mps_environment, private_mps
from fusedresnet.backend.triton_server.installation import find_triton, host_gpus


@pytest.mark.skipif(bool(host_gpus()), reason="a GPU host: --mps would start the daemon")
def test_launcher_refuses_mps_without_a_gpu_and_starts_no_server(tmp_path, capsys):
    token = tmp_path / "token"
    token.write_text("t" * 32)
    assert serve.main(["--mps", "--admin-token-file", str(token), "--model-repository", str(tmp_path)]) == 1
    assert "--mps: no GPU on this host" in capsys.readouterr().err


def test_a_missing_mps_control_is_named_with_where_it_comes_from(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(MpsError, match=f"{MPS_CONTROL} not found .*driver's utilities"):
        with private_mps(tmp_path / "mps"):
            pass
    assert not (tmp_path / "mps").exists()     # nothing made before the refusal


def test_server_processes_get_the_daemons_pipes_on_a_gpu_only(tmp_path):
    triton = find_triton()
    mps = mps_environment(tmp_path)
    assert mps == {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "log")}
    on_gpu = serve.TritonServer(admin_token="t", use_gpu=True, mps_environment=mps).environment(triton)
    assert {key: on_gpu[key] for key in mps} == mps
    on_cpu = serve.TritonServer(admin_token="t", use_gpu=False, mps_environment=mps).environment(triton)
    assert on_cpu["CUDA_VISIBLE_DEVICES"] == "" and not any(key in on_cpu and on_cpu[key] == value
                                                             for key, value in mps.items())


def group_of(use_gpu: bool, processes: int = 2) -> serve.ServerGroup:
    return serve.ServerGroup([serve.TritonServer(admin_token="t", use_gpu=use_gpu, metrics_port=9000 + k)
                              for k in range(processes)])


def stand_in_control(folder, log):
    """An nvidia-cuda-mps-control on PATH that writes how it was called (its stdin too) and succeeds."""
    folder.mkdir()
    control = folder / MPS_CONTROL
    control.write_text(f"#!/bin/sh\necho \"args=$* pipe=$CUDA_MPS_PIPE_DIRECTORY\" >> {log}\n"
                       f"if [ $# -eq 0 ]; then cat >> {log}; fi\n")
    control.chmod(0o755)


def test_auto_is_off_without_a_gpu_and_says_nothing(tmp_path, capsys):
    group = group_of(use_gpu=False)
    with contextlib.ExitStack() as resources:
        group.use_mps("auto", tmp_path / "mps", resources)
    assert all(server.mps_environment is None for server in group.servers)
    assert not (tmp_path / "mps").exists() and capsys.readouterr().err == ""


def test_auto_on_a_gpu_without_the_daemon_serves_without_it_and_says_why(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    group = group_of(use_gpu=True)
    with contextlib.ExitStack() as resources:
        group.use_mps("auto", tmp_path / "mps", resources)
    assert all(server.mps_environment is None for server in group.servers)
    assert f"CUDA MPS off (--mps auto): CUDA MPS: {MPS_CONTROL} not found" in capsys.readouterr().err
    with pytest.raises(serve.ServerError, match=f"--mps: CUDA MPS: {MPS_CONTROL} not found"):
        with contextlib.ExitStack() as resources:
            group.use_mps("on", tmp_path / "mps", resources)
    with pytest.raises(serve.ServerError, match="no GPU on this host"):
        with contextlib.ExitStack() as resources:
            group_of(use_gpu=False).use_mps("on", tmp_path / "mps", resources)


@pytest.mark.parametrize("choice", ["auto", "on"])
def test_a_gpu_with_the_daemon_puts_every_process_under_it_and_quits_it_at_the_end(tmp_path, monkeypatch, choice):
    log = tmp_path / "control.log"
    stand_in_control(tmp_path / "bin", log)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    group = group_of(use_gpu=True, processes=3)
    with contextlib.ExitStack() as resources:
        group.use_mps(choice, tmp_path / "mps", resources)
        assert [server.mps_environment for server in group.servers] == [mps_environment(tmp_path / "mps")] * 3
        assert log.read_text().splitlines() == [f"args=-d pipe={tmp_path / 'mps' / 'pipe'}"]
    assert log.read_text().splitlines()[1:] == [f"args= pipe={tmp_path / 'mps' / 'pipe'}", "quit"]


def test_off_starts_no_daemon_even_where_one_could_run(tmp_path, monkeypatch):
    log = tmp_path / "control.log"
    stand_in_control(tmp_path / "bin", log)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    group = group_of(use_gpu=True)
    with contextlib.ExitStack() as resources:
        group.use_mps("off", tmp_path / "mps", resources)
    assert all(server.mps_environment is None for server in group.servers) and not log.exists()


def test_launcher_defaults_to_auto_and_takes_mps_alone_as_on():
    parser = serve.build_parser()
    assert [parser.parse_args(argv).mps for argv in ([], ["--mps"], ["--mps", "off"], ["--mps", "auto"])] == \
        ["auto", "on", "off", "auto"]
    with pytest.raises(SystemExit):
        parser.parse_args(["--mps", "maybe"])


@pytest.mark.gpu
@pytest.mark.skipif(not host_gpus() or not shutil.which(MPS_CONTROL), reason="needs a GPU and nvidia-cuda-mps-control")
def test_private_daemon_starts_and_quits_on_a_gpu_host(tmp_path):
    with private_mps(tmp_path) as env:
        assert (tmp_path / "pipe" / "control").exists(), sorted(p.name for p in (tmp_path / "pipe").iterdir())
        assert env == mps_environment(tmp_path)
