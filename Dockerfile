# fusedresnet images: the server (the last stage, what `docker build .` gives) and the
# locust load generator (`--target loadtest`, used by docker-compose.yml and deploy/kubernetes).
#
#   docker build -t fusedresnet .
#   docker run --gpus 1 --shm-size=2g -p 127.0.0.1:8000-8002:8000-8002 \
#       -e FUSEDRESNET_ADMIN_TOKEN="$(openssl rand -hex 24)" \
#       -v fusedresnet-cupy:/var/cache/fusedresnet fusedresnet
#
# Base: NGC tritonserver 24.10 = Triton 2.51 (the server version the tests run, from the
# nvidia-pytriton wheel), Ubuntu 22.04, Python 3.10, CUDA 12.6. torch 2.13.0 has cp310 wheels
# and brings its own CUDA 13 libraries (pip packages; NVIDIA driver >= 580, as on the GPU host);
# cupy-cuda12x compiles the fused kernels with the image's CUDA 12.6 NVRTC.
# Why each setting: docs/DEPLOYMENT.md, section "Docker".
# From Triton 26.05 client shared memory is opt-in: a base image of 26.05 or later needs
# --allow-client-shm among the server's Triton arguments (docs/DEPLOYMENT.md, Several GPUs).
ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:24.10-py3
ARG LOADTEST_IMAGE=python:3.12-slim-bookworm

# What both images install from: the package's sources and the model repository.
FROM scratch AS source
WORKDIR /opt/fusedresnet
COPY pyproject.toml README.md ./
COPY backend backend
COPY kernels kernels
COPY client client
COPY loadtest loadtest
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
ENV FUSEDRESNET_HOME=/opt/fusedresnet \
    TRITON_HOME=/opt/fusedresnet/triton \
    CUPY_CACHE_DIR=/var/cache/fusedresnet/cupy \
    PYTHONUNBUFFERED=1
WORKDIR /opt/fusedresnet
COPY --from=source /opt/fusedresnet ./
COPY deploy/docker/entrypoint.sh /usr/local/bin/fusedresnet-entrypoint
# `server` + `gpu` extras only: torch, Triton's client, psutil, CuPy; no locust or matplotlib.
# The model files are prepared here with the seeded weights (a checkpoint mounted at start
# replaces them: FUSEDRESNET_WEIGHTS). The source folders go once the package is installed.
# hadolint ignore=DL3013
RUN python3 -m pip install --no-cache-dir '.[server,gpu]' \
 && python3 -c "import cupy, torch, fusedresnet.backend.serve" \
 && python3 -m fusedresnet.backend.prepare \
 && rm -rf backend kernels client loadtest harness \
 && mkdir -p triton/backends build /var/cache/fusedresnet/cupy \
 && ln -s /opt/tritonserver/bin triton/bin \
 && ln -s /opt/tritonserver/caches triton/caches \
 && ln -s /opt/tritonserver/backends/python triton/backends/python \
 && useradd --no-log-init --uid 10001 --no-create-home --home-dir /opt/fusedresnet --shell /usr/sbin/nologin fusedresnet \
 && chown -R 10001:10001 build model_repository /var/cache/fusedresnet
VOLUME ["/var/cache/fusedresnet"]
USER 10001
EXPOSE 8000 8001 8002
# The first start compiles the kernels (minutes); later starts read them from CUPY_CACHE_DIR.
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python3", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=4).status != 200)"]
ENTRYPOINT ["fusedresnet-entrypoint"]
# Inside a container the server must listen on 0.0.0.0; the admin APIs stay behind the token.
# --no-restart: a dead Python stub ends the container (status 3) and its restart policy brings it back.
CMD ["--host", "0.0.0.0", "--no-restart", "--ready-timeout", "900", "--", "--metrics-config=summary_latencies=true"]
