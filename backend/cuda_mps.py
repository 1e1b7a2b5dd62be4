"""CUDA MPS (Multi-Process Service) for the server's processes: a private MPS control daemon.

Each model instance of the Python backend is a process with its own CUDA context, and a GPU
time-slices the contexts of several processes. Under MPS their kernels share the GPU instead:
the custom model over CUDA shared memory serves 90.5k img/s at 32 images per request under MPS
against 60.3k without (H100, results/loadtest_ab.md).

`private_mps(folder)` starts `nvidia-cuda-mps-control -d` with its pipe and log directories under
`folder` (so it neither needs nor disturbs a host-wide daemon) and yields the environment that
puts a process under it (CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY); on exit it tells the
daemon to quit. The launcher's `--mps` and the perf_analyzer run's story use it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

MPS_CONTROL = "nvidia-cuda-mps-control"
QUIT_TIMEOUT_S = 30


class MpsError(RuntimeError):
    pass


def mps_environment(folder: Path) -> dict[str, str]:
    """The variables that send a process's CUDA work to the daemon whose pipes are under `folder`."""
    return {"CUDA_MPS_PIPE_DIRECTORY": str(Path(folder) / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(Path(folder) / "log")}


@contextlib.contextmanager
def private_mps(folder: Path):
    """A private MPS control daemon for the processes started inside with the yielded environment."""
    control = shutil.which(MPS_CONTROL)
    if control is None:
        raise MpsError(f"CUDA MPS: {MPS_CONTROL} not found (it comes with the NVIDIA driver's utilities; in a "
                       "container, NVIDIA_DRIVER_CAPABILITIES must include compute and utility)")
    env = mps_environment(folder)
    for path in env.values():
        Path(path).mkdir(parents=True, exist_ok=True)
    try:
        started = subprocess.run([control, "-d"], env={**os.environ, **env}, capture_output=True, text=True,
                                 timeout=60)
    except subprocess.TimeoutExpired as expired:
        raise MpsError(f"CUDA MPS: `{MPS_CONTROL} -d` did not return in 60 s") from expired
    if started.returncode != 0:
        output = (started.stdout + started.stderr).strip() or "no output"
        raise MpsError(f"CUDA MPS: `{MPS_CONTROL} -d` failed (exit {started.returncode}): {output}; "
                       f"its log: {env['CUDA_MPS_LOG_DIRECTORY']}")
    try:
        yield env
    finally:
        try:
            subprocess.run([control], input="quit\n", env={**os.environ, **env}, capture_output=True, text=True,
                           timeout=QUIT_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            # The daemon quits once its clients are gone: a process still holding a CUDA context under it (a load
            # generator of this process, say) keeps it up; it ends with that process. Nothing here to fail for.
            print(f"fusedresnet: CUDA MPS: the daemon of {folder} did not quit in {QUIT_TIMEOUT_S} s (a client still "
                  "holds a CUDA context under it); it quits when that client exits", file=sys.stderr, flush=True)
