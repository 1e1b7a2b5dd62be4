# fusedresnet images: the server (the last stage, what `docker build .` gives) and the
# locust load generator (`--target loadtest`, used by docker-compose.yml and deploy/kubernetes).
#
#   docker build -t fusedresnet .
#   docker run --gpus 1 --shm-size=4g -p 127.0.0.1:8000-8003:8000-8003 \
#       -e FUSEDRESNET_ADMIN_TOKEN="$(openssl rand -hex 24)" \
#       -v fusedresnet-cupy:/var/cache/fusedresnet fusedresnet
#
# Base: NGC tritonserver 26.08 = Triton 2.73.0 (tritonclient 2.73.0 is the client pinned in pyproject.toml),
# Ubuntu 24.04, Python 3.12, CUDA 13.4.1 (driver 580 or later: CUDA 13 minor-version compatibility, as on the
# GPU host). It has the fix of the gRPC frontend's crash when clients cancel or close calls in flight
# (server#7840, 24.12, and the later cancellation fixes #8078 and #8220), which the pip path's 2.51 lacks.
# torch 2.13.0 has cp312 wheels built for CUDA 13; the gpu extra's cupy-cuda13x compiles the fused kernels
# with its own NVRTC 13.0 (nvidia-cuda-nvrtc): one CUDA major in the process, as the image's Triton.
# Two flags changed meaning since 2.51 (docs/DEPLOYMENT.md, "Docker"): client shared memory is off unless
# --allow-client-shm=true (26.04 on; left off here: no client shares this container's memory), and HTTP
# refuses an input over --http-max-input-size (25.06 on, 64 MiB: the CMD raises it to one 128-image FP32 batch).
# Why each setting: docs/DEPLOYMENT.md, section "Docker".
ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:26.08-py3
ARG LOADTEST_IMAGE=python:3.12-slim-bookworm

# What both images install from: the package's sources and the model repository.
FROM scratch AS source
WORKDIR /opt/fusedresnet
COPY pyproject.toml README.md ./
COPY backend backend
COPY kernels kernels
COPY client client
COPY loadtest loadtest
COPY campaigns campaigns
COPY harness harness
COPY model_repository model_repository

FROM ${LOADTEST_IMAGE} AS loadtest
WORKDIR /opt/fusedresnet
COPY --from=source /opt/fusedresnet ./
# DL3013 (pin versions in pip): the extras pin every version in pyproject.toml.
# hadolint ignore=DL3013
RUN python3 -m pip install --no-cache-dir '.[loadtest]' \
 && useradd --no-log-init --uid 10001 --create-home --shell /usr/sbin/nologin locust
USER 10001
EXPOSE 8089 5557
ENTRYPOINT ["locust", "-f", "/opt/fusedresnet/loadtest/locustfile.py"]

FROM ${TRITON_IMAGE} AS server
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# FUSEDRESNET_HOME: the model repository and build/ (admin token, the launcher's backend tree).
# TRITON_HOME: the launcher copies $TRITON_HOME/backends at start; this tree holds only the
# Python backend (symlinks into /opt/tritonserver), not the image's gigabytes of other backends.
# NVIDIA_DRIVER_CAPABILITIES: `utility` makes the container toolkit mount nvidia-cuda-mps-control, so the
# launcher's processes run under CUDA MPS (--mps auto; without it they serve without MPS, said in one line).
# FUSEDRESNET_FRONT_END=binary: the image's tritonserver is 2.73 itself, current frontends and core alike; the
# in-process front end (backend/triton_server/front_end.py) exists for the pip path's 2.51 binary.
ENV FUSEDRESNET_HOME=/opt/fusedresnet \
    FUSEDRESNET_FRONT_END=binary \
    TRITON_HOME=/opt/fusedresnet/triton \
    CUPY_CACHE_DIR=/var/cache/fusedresnet/cupy \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    PYTHONUNBUFFERED=1
WORKDIR /opt/fusedresnet
COPY --from=source /opt/fusedresnet ./
COPY deploy/docker/entrypoint.sh /usr/local/bin/fusedresnet-entrypoint
COPY deploy/docker/fusedresnet-ready /usr/local/bin/fusedresnet-ready
# `server` + `gpu` extras only: torch, Triton's client, psutil, CuPy; no locust or matplotlib. Two steps, as
# `make setup` does: the server extra's nvidia-pytriton 0.7.0 (unused here) declares NumPy < 2 and CuPy 14 needs
# NumPy 2, which one resolution refuses; the Python backend reads and writes tensors through DLPack, right on
# either NumPy (the image's pip installs into its system Python: NGC sets PIP_BREAK_SYSTEM_PACKAGES=1).
# The model files are prepared here with the seeded weights (a checkpoint mounted at start
# replaces them: FUSEDRESNET_WEIGHTS). The A/B router's C++ backend is built here (backend/ab_router/build.py:
# build/ab_router_backend/, found again at start from the installed sources) with g++ alone (RapidJSON and
# BLAKE2 are vendored with its source); the library needs only the C library. The source folders go once the
# package is installed.
# DL3008 (pin apt versions): the compiler is the base image's Ubuntu's.
# hadolint ignore=DL3008,DL3013
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ \
 && python3 -m pip install --no-cache-dir '.[server]' \
 && python3 -m pip install --no-cache-dir '.[gpu]' \
 && python3 -c "import cupy, torch, fusedresnet.backend.serve" \
 && python3 -m fusedresnet.backend.repository.prepare \
 && python3 -m fusedresnet.backend.ab_router.build \
 && rm -rf /var/lib/apt/lists/* \
 && rm -rf backend kernels client loadtest campaigns harness \
 && mkdir -p triton/backends build /var/cache/fusedresnet/cupy \
 && ln -s /opt/tritonserver/bin triton/bin \
 && ln -s /opt/tritonserver/caches triton/caches \
 && ln -s /opt/tritonserver/backends/python triton/backends/python \
 && useradd --no-log-init --uid 10001 --no-create-home --home-dir /opt/fusedresnet --shell /usr/sbin/nologin fusedresnet \
 && chown -R 10001:10001 build model_repository /var/cache/fusedresnet
VOLUME ["/var/cache/fusedresnet"]
USER 10001
# HTTP, gRPC (both shared by the server processes) and the metrics port of each process: 8002 and 8003 for
# the 2 processes of one GPU (--processes-per-gpu 2); a larger N uses 8004, ... (publish them too).
EXPOSE 8000 8001 8002 8003
# The first start compiles the kernels (minutes); later starts read them from CUPY_CACHE_DIR.
# Readiness on the shared HTTP port: SOME process serves (the service is up); `fusedresnet-ready` asks every
# process through its own metrics port (the launcher restarts a crashed one alone, on the same ports).
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python3", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=4).status != 200)"]
ENTRYPOINT ["fusedresnet-entrypoint"]
# Inside a container the server must listen on 0.0.0.0; the admin APIs stay behind the token.
# 2 tritonserver processes on the GPU behind the same ports; no --no-restart: a process that crashes, hangs or
# loses a Python stub is restarted alone by the launcher while the other serves (a crash costs capacity, not
# the service). Past 3 restarts of one process within 10 minutes the launcher stops and exits (status 3: a
# stub died, 4: a server died), and the container's restart policy brings it back.
# --http-max-input-size: 128 MiB, one 128-image FP32 batch (77 MB) of the *_normalized models over HTTP.
CMD ["--host", "0.0.0.0", "--processes-per-gpu", "2", "--ready-timeout", "900", "--", \
     "--metrics-config=summary_latencies=true", "--http-max-input-size=134217728"]
