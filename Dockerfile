# fusedresnet on NVIDIA's Triton image (Triton 2.51 = NGC 24.10, with GPU support).
#
#   docker build -t fusedresnet .
#   docker run --gpus all -p 127.0.0.1:8000-8002:8000-8002 \
#       -e FUSEDRESNET_ADMIN_TOKEN=$(openssl rand -hex 24) fusedresnet
#
# Inside the container the server must listen on 0.0.0.0 to be reachable; publish
# the ports on 127.0.0.1 (as above) unless you mean to expose the service. The
# admin APIs stay behind FUSEDRESNET_ADMIN_TOKEN (a random one is generated into
# build/admin-token inside the container when it is not set).
FROM nvcr.io/nvidia/tritonserver:24.10-py3

WORKDIR /opt/fusedresnet
COPY pyproject.toml README.md ./
COPY backend backend
COPY kernels kernels
COPY client client
COPY loadtest loadtest
COPY model_repository model_repository
RUN python3 -m pip install --no-cache-dir -e '.[server,gpu]' \
 && python3 -m fusedresnet.backend.prepare
ENV CUPY_CACHE_DIR=/opt/fusedresnet/build/cupy-cache
EXPOSE 8000 8001 8002
CMD ["python3", "-m", "fusedresnet.backend.serve", "--host", "0.0.0.0"]
