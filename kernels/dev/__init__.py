"""fusedresnet.kernels.dev: kernel experiments kept apart from the kernels that ship (as llm.c's dev/cuda).

A candidate that the tuner never chose lives here, with its .cu file and a runner that checks it against
a float32 reference first and then times it beside the plans the served library uses:

    conv_wgmma_ws.cu / .py   conv_wgmma with a producer warpgroup on cp.async and full / empty mbarriers
                             (v2 of conv_wgmma.cu; NOTES.md outcome 11: 17-23% slower, never chosen)
                             python -m fusedresnet.kernels.dev.conv_wgmma_ws [--batch 128]

The engine never compiles these: they are appended to the translation unit only by their runner
(`KernelLibrary(dev_sources=..., dev_kernels=...)`). The CPU compile tests build each one with nvcc
(tests/test_kernels_compile.py), and kernels/sass_diff.py dumps them with `--dev`.
"""

from __future__ import annotations

from pathlib import Path

DEV_SOURCES = tuple(sorted(Path(__file__).resolve().parent.glob("*.cu")))


def dev_name_expressions() -> dict[Path, list[str]]:
    """{.cu file: the kernel instantiations its runner compiles} of every experiment here."""
    from . import conv_wgmma_ws
    return {conv_wgmma_ws.SOURCE: [t.name_expression for t in conv_wgmma_ws.TILES]}
