"""CUDA MPS for the server's processes (backend/cuda_mps.py, the launcher's --mps): refused clearly where it
cannot run, its environment given to the server's processes only on a GPU, and a real daemon on a GPU host."""

from __future__ import annotations

import shutil

import pytest

from fusedresnet.backend import serve
from fusedresnet.backend.cuda_mps import MPS_CONTROL, MpsError, mps_environment, private_mps
from fusedresnet.backend.triton_install import find_triton, host_gpus


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


@pytest.mark.gpu
@pytest.mark.skipif(not host_gpus() or not shutil.which(MPS_CONTROL), reason="needs a GPU and nvidia-cuda-mps-control")
def test_private_daemon_starts_and_quits_on_a_gpu_host(tmp_path):
    with private_mps(tmp_path) as env:
        assert (tmp_path / "pipe" / "control").exists(), sorted(p.name for p in (tmp_path / "pipe").iterdir())
        assert env == mps_environment(tmp_path)
