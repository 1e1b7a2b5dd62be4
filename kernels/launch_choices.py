"""What a device runs: its convolution path (kernel family) and launch mode, from explicit requests.

Nothing here reads the environment: the server's `EngineConfig` and the command-line tools resolve the
developer overrides (FUSEDRESNET_CONV_PATH, FUSEDRESNET_PDL) once and pass them in. Pure Python.
"""

from __future__ import annotations

from .build import WGMMA_ARCH

# The convolution paths (kernel families). "mma": mma.sync kernels only,
# compiled by CuPy's RawModule for whatever architecture CuPy picks (sm_80,
# sm_86, sm_89, sm_90, ...). "wgmma": compute capability 9.0 only, every
# generic convolution on conv_wgmma. "mixed": compute capability 9.0 only,
# each convolution plan names its own family (tuned table, else
# `plan_default`). On cc 9.0 "wgmma" and "mixed" load one sm_90a module
# compiled by nvrtc_build.py that holds both families (mma.sync assembles for
# sm_90a unchanged). A caller may force one family everywhere (for
# comparisons: config conv_path, FUSEDRESNET_CONV_PATH=mma|wgmma); auto (the
# default) is mixed on cc 9.0 and mma elsewhere.
CONV_PATHS = ("mma", "wgmma")        # the families a table records and a caller can force
MIXED = "mixed"
WGMMA_CC = (9, 0)


def path_arch(path: str) -> str | None:
    """The architecture a path's module is compiled for: sm_90a for wgmma and mixed, CuPy's choice for mma."""
    return WGMMA_ARCH if path in ("wgmma", MIXED) else None


def conv_path(cc: tuple[int, int], requested: str | None = None) -> str:
    """The convolution path for a device of compute capability `cc`: "mixed" on 9.0, else "mma".

    `requested` (None: auto) may be "auto", force "mma" anywhere, or force "wgmma"
    (an error off cc 9.0: no silent fallback).
    """
    choice = (requested or "").strip().lower() or "auto"
    if choice == "auto":
        return MIXED if tuple(cc) == WGMMA_CC else "mma"
    if choice == MIXED and tuple(cc) == WGMMA_CC:
        return MIXED
    if choice not in CONV_PATHS:
        raise ValueError(f"conv path {choice!r}: expected auto, mma or wgmma")
    if choice == "wgmma" and tuple(cc) != WGMMA_CC:
        raise RuntimeError(f"the wgmma path needs compute capability 9.0 (sm_90a), this device is {cc[0]}.{cc[1]}")
    return choice


PDL_MIN_CC = (9, 0)   # griddepcontrol (sm_90) and the launch attribute
# The engine's batch buckets up to this one are captured with programmatic dependent launch, larger ones
# plainly: measured on the H100 (kernels/NOTES.md, outcomes 12 and 16), PDL gains 3-10% at batch 1, 2, 8
# and 16, is even at 4, and since layer1 runs on the persistent conv3x3_patch_wgmma costs 5-10% at 32
# (it gained 3-5% there before) and 1-2% from 64 up. With the trigger after the main loop (outcome 23) it
# measured -2% at 64, -1% at 128, but +1-6% at 32 and +4% at 256 (outcome 26): left at 16.
PDL_MAX_BATCH = 16
# The engine fuses each downsampling block's 1x1 projection into its conv2 (kernels/loaders.cuh) for the
# batch buckets from this one up, and runs it as its own kernel beside conv1 (a second captured stream)
# below: measured on the H100 (kernels/NOTES.md, outcomes 22 and 27), fused is 4-5% faster at batch 32 and
# 128, 2% at 256 and 2-2.5% at 8 and 16 (since the trigger comes after the main loop), and 1.4-7.5% slower
# at batch 1, 2 and 4, where the projection beside conv1 costs nothing.
SHORTCUT_FUSION_MIN_BATCH = 8


def pdl_choice(cc: tuple[int, int], requested: bool | None = None) -> tuple[bool, str]:
    """(use programmatic dependent launch, why) for a device of compute capability `cc`.

    `requested`: None = where possible; False = off; True makes a device or a host that cannot do it an
    error, not a silent plain launch.
    """
    if requested is False:
        return False, "turned off by the caller"
    if tuple(cc) < PDL_MIN_CC:
        if requested:
            raise RuntimeError(f"programmatic dependent launch needs compute capability "
                               f"{PDL_MIN_CC[0]}.{PDL_MIN_CC[1]}, this is {cc[0]}.{cc[1]}")
        return False, f"compute capability {cc[0]}.{cc[1]} < {PDL_MIN_CC[0]}.{PDL_MIN_CC[1]}"
    if not has_cuda_bindings():
        if requested:
            raise ImportError("programmatic dependent launch needs cuda.bindings (pip install 'fusedresnet[gpu]')")
        return False, "cuda.bindings is not installed"
    return True, f"compute capability >= {PDL_MIN_CC[0]}.{PDL_MIN_CC[1]}"


def has_cuda_bindings() -> bool:
    """Whether cuda.bindings (cuLaunchKernelEx: programmatic and cluster launches) can be imported here."""
    try:
        from cuda.bindings import driver  # noqa: F401
    except ImportError:
        return False
    return True


def bindings_launch_choice(wgmma_module: bool) -> tuple[bool, str]:
    """(the "wc", "wt" and "wq" tiles can launch, why): thread-block clusters and tensor maps need the sm_90a
    module and cuda.bindings (cuLaunchKernelEx, cuTensorMapEncode*). Without, a tuned "wc", "wt" or "wq" plan
    runs on its twin (`without_cuda_bindings`)."""
    if not wgmma_module:
        return False, "no sm_90a module (compute capability 9.0 only)"
    if not has_cuda_bindings():
        return False, "cuda.bindings is not installed"
    return True, "sm_90a module and cuda.bindings"
