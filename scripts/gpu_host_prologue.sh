# shellcheck shell=bash
# The start of every GPU-host task script, sourced from the repository root once the script has set
# its default output folder:
#   OUT="${OUT:-build/gpu-host}"
#   source scripts/gpu_host_prologue.sh
# 1. makes $OUT, and puts a carried h2load and perf on PATH;
# 2. sets the host up (scripts/gpu_host_env.sh: the offline bundle, the project, the model files),
#    its output in $OUT/setup.log, shown and the script stopped if it fails; a script started by
#    another one that already did it (FUSEDRESNET_GPU_HOST_READY=1) skips it;
# 3. writes the device description, $OUT/device.txt, and prints it: the date (UTC), each GPU (index,
#    name, driver, memory), the CPU cores, the code's commit (fusedresnet.backend.provenance:
#    FUSEDRESNET_GIT_COMMIT when set, else the checkout's) and the versions of torch, CUDA, CuPy, NumPy.
mkdir -p "$OUT"
# h2load (plain gRPC load), where the call carried it: .h2load/root, or .h2load/h2load.tar.xz of that root
# (scripts/gpu_host_front_door.sh says how to make it); the host has none.
if [ -f .h2load/h2load.tar.xz ] && [ ! -x .h2load/root/usr/bin/h2load ]; then tar xJf .h2load/h2load.tar.xz -C .h2load; fi
if [ -x .h2load/root/usr/bin/h2load ]; then
    export PATH="$PWD/.h2load/root/usr/bin:$PATH" LD_LIBRARY_PATH="$PWD/.h2load/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
# Linux perf (issue 46's flame graphs), where the call carried it: .perf/perf.tar.xz (6 MB) of a root/ with Debian
# 12's perf and the libraries it needs that the host lacks, made on a Debian 12 machine with
#   mkdir -p .perf/debs && (cd .perf/debs && apt-get download linux-perf libopencsd1 libperl5.36 libpython3.11 \
#     libbabeltrace1 libslang2 libdw1 libelf1 libunwind8 libnuma1 libglib2.0-0) \
#   && for deb in .perf/debs/*.deb; do dpkg -x "$deb" .perf/root; done && cd .perf/root/usr \
#   && rm -rf share lib/perf-core lib/python3* lib/x86_64-linux-gnu/{perl,glib-2.0,libgio*} bin/cpan* bin/perl5* \
#   && cd ../.. && tar cJf perf.tar.xz root && rm -rf debs root
# perf runs through a wrapper that gives only perf those libraries.
if [ -f .perf/perf.tar.xz ] && [ ! -d .perf/root/usr/bin ]; then tar xJf .perf/perf.tar.xz -C .perf; fi
if [ -d .perf/root/usr/bin ]; then
    mkdir -p .perf/bin
    printf '#!/bin/sh\nLD_LIBRARY_PATH="%s:%s" exec "%s" "$@"\n' "$PWD/.perf/root/usr/lib/x86_64-linux-gnu" \
        "$PWD/.perf/root/lib/x86_64-linux-gnu" "$PWD/.perf/root/usr/bin/perf" > .perf/bin/perf
    chmod +x .perf/bin/perf
    export PATH="$PWD/.perf/bin:$PATH"
fi
if [[ ${FUSEDRESNET_GPU_HOST_READY:-} != 1 ]]; then
    # shellcheck source=scripts/gpu_host_env.sh
    source scripts/gpu_host_env.sh > "$OUT/setup.log" 2>&1 || { cat "$OUT/setup.log"; exit 1; }
    export FUSEDRESNET_GPU_HOST_READY=1
fi
{
    date -u
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
    echo "cores $(nproc)"
    echo "code $(python3 -m fusedresnet.backend.provenance)"
    python3 -c "
import numpy, torch
try:
    import cupy
    cupy_text = f'cupy {cupy.__version__} (CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()})'
except ImportError:
    cupy_text = 'no cupy'
print(f'torch {torch.__version__} (CUDA {torch.version.cuda}), {cupy_text}, numpy {numpy.__version__}')"
} 2>&1 | tee "$OUT/device.txt"
