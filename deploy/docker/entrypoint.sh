#!/bin/sh
# The image's entry point: the repository's launcher, with the model files from a mounted
# checkpoint when FUSEDRESNET_WEIGHTS names one (a torchvision .pth; .onnx needs the onnx package);
# otherwise the seeded weights prepared when the image was built. Arguments go to the launcher:
#   python3 -m fusedresnet.backend.serve --host 0.0.0.0 --processes-per-gpu 2 ... -- <tritonserver flags>
set -eu
if [ -n "${FUSEDRESNET_WEIGHTS:-}" ]; then
    python3 -m fusedresnet.backend.repository.prepare --weights "$FUSEDRESNET_WEIGHTS"
fi
exec python3 -m fusedresnet.backend.serve "$@"
