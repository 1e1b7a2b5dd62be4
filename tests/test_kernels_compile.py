"""Every CUDA source in kernels/ compiles for every architecture the engine supports (CPU only, no GPU).

`configs.ARCHS`: sm_80, sm_86, sm_89 and sm_90 (the mma.sync path, compiled
by CuPy's RawModule) and sm_90a (the wgmma path, compiled by
`kernels/nvrtc_build.py`). For each, the translation unit is exactly what the
engine compiles (`configs.source_text(arch)`, the same options) with every
kernel instantiation the launcher uses on that path:
- with nvcc (warnings as errors, no register spills in the matrix kernels, no
  serialised wgmma), plus a line that takes the address of each instantiation;
- with NVRTC, the library the engine compiles with (the CUDA toolkit's or the
  nvidia-cuda-nvrtc wheel's: this runs on a CPU-only machine), every name
  expression lowered.
A syntax error in a .cu file, or PTX that does not assemble for one target, cannot land.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from fusedresnet.kernels.configs import (
    ARCHS,
    COMPILE_OPTIONS,
    HEADERS,
    KERNEL_DIR,
    SOURCES,
    STEM_WGMMA_BLOCKS_PER_SM,
    STEM_WGMMA_SMEM_BYTES,
    STEM_WGMMA_THREADS,
    WGMMA_ARCH,
    WGMMA_CLUSTER_TILES,
    WGMMA_CONV_TILES,
    WGMMA_HEADERS,
    WGMMA_SOURCES,
    WGMMA_TILES,
    Epilogue,
    Schedule,
    WgmmaConfig,
    name_expressions,
    nvrtc_options,
    shortcut_applies,
    shortcut_name_expression,
    source_text,
)

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH: cannot compile the CUDA kernels here")


def test_every_cu_file_is_part_of_the_compiled_source():
    on_disk = sorted(p.name for p in KERNEL_DIR.glob("*.cu"))
    assert on_disk == sorted(SOURCES), "a .cu file in kernels/ is not listed in configs.SOURCES (never compiled)"
    assert sorted(p.name for p in KERNEL_DIR.glob("*.cuh")) == sorted(HEADERS + WGMMA_HEADERS)
    for arch in ("sm_80", WGMMA_ARCH):   # each header pasted once, no #include left for NVRTC to resolve
        text = source_text(arch)
        assert not re.search(r"^\s*#\s*include", text, re.M)
        for name in HEADERS + WGMMA_HEADERS:
            guard = "FUSEDRESNET_" + name.removesuffix(".cuh").upper() + "_CUH"
            assert text.count(f"#define {guard}") == (arch == WGMMA_ARCH or name in HEADERS), (arch, name)
    for name in SOURCES:
        assert f"// ---- {name} ----" in source_text(WGMMA_ARCH)
    for name in WGMMA_SOURCES:   # wgmma does not assemble for the other targets
        assert f"// ---- {name} ----" not in source_text("sm_90")
    wgmma_names = {t.name_expression for t in WGMMA_TILES}
    assert wgmma_names <= set(name_expressions(WGMMA_ARCH))
    assert not wgmma_names & set(name_expressions("sm_80"))


def nvcc_report(tmp_path, arch: str, source: str, names: list[str], *options: str) -> str:
    """nvcc's resource report of `source` with every kernel of `names` instantiated (warnings are errors)."""
    path = tmp_path / "fusedresnet_kernels.cu"
    path.write_text(source + "\nvoid *fusedresnet_instances[] = {" + ", ".join(f"(void *)&{name}" for name in names)
                    + "};\n")
    cmd = [NVCC, f"-arch={arch}", *COMPILE_OPTIONS, *options, "-cubin", "-Werror", "all-warnings",
           "--resource-usage", "-o", str(tmp_path / "kernels.cubin"), str(path)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stderr}"
    return result.stdout + result.stderr


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
def test_kernels_compile_for_arch_without_warnings_or_spills(arch, tmp_path):
    names = name_expressions(arch)
    report = nvcc_report(tmp_path, arch, source_text(arch), names)
    compiled = re.findall(r"Function properties for (\S+)", report)
    assert len(compiled) == len(names), report
    # The matrix kernels must keep their accumulators (and the wgmma stem its A fragments) in registers.
    checked = 0
    for block in report.split("Function properties for ")[1:]:
        if block.startswith(("_Z18conv_implicit_gemm", "_Z10conv_wgmma", "_Z13conv_wgmma_ws", "_Z14conv_wgmma_tma",
                             "_Z15stem_pool_wgmma", "_Z19conv3x3_patch_wgmma")):
            assert " 0 bytes spill stores" in block, block
            checked += 1
        if block.startswith("_Z15stem_pool_wgmma"):   # its blocks per SM (the persistent grid) fit the registers
            registers = int(re.search(r"Used (\d+) registers", block).group(1))
            assert blocks_by_registers(registers, STEM_WGMMA_THREADS) >= STEM_WGMMA_BLOCKS_PER_SM, block
        if block.startswith("_Z19conv3x3_patch_wgmma"):   # persistent: one block of WGS warpgroups per SM
            registers = int(re.search(r"Used (\d+) registers", block).group(1))
            warpgroups = int(re.match(r"_Z19conv3x3_patch_wgmmaILi\d+ELi(\d+)E", block).group(1))
            assert blocks_by_registers(registers, warpgroups * 128) >= 1, block
    assert checked >= len([n for n in names if n.startswith(("conv_implicit_gemm", "conv_wgmma", "stem_pool_wgmma",
                                                             "conv3x3_patch_wgmma"))])
    # Every wgmma tile's registers fit the blocks per SM the cost model counts on (configs blocks_per_sm).
    # (An L2 prefetch added to the prologue once took the s3 128x128 tile from 124 to 132 registers: one
    # block per SM instead of two, layer2 at batch 128 1.5x slower.)
    if arch == WGMMA_ARCH:
        schedules, epilogues = list(Schedule), list(Epilogue)   # the C++ enum classes' values: their order
        by_args = {(t.bm, t.bn, t.warpgroups, t.stages, schedules.index(t.schedule), epilogues.index(t.epilogue)): t
                   for t in WGMMA_CONV_TILES}
        seen = 0
        for block in report.split("Function properties for ")[1:]:
            # conv_wgmma<BM, BN, WGS, STAGES, Schedule, ConvInput>;
            # conv_wgmma_tma<BM, BN, WGS, STAGES, Schedule, Epilogue>
            match = re.match(r"_Z1[04](conv_wgmma(?:_tma)?)ILi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)EL8Schedule(\d+)E"
                             r"(?:L9ConvInput\d+E|L8Epilogue(\d+)E)E", block)
            if match:
                tile = by_args[tuple(int(v) for v in match.groups()[1:6]) + (int(match.group(7) or 0),)]
                registers = int(re.search(r"Used (\d+) registers", block).group(1))
                assert blocks_by_registers(registers, tile.threads) >= tile.blocks_per_sm, (tile.label, registers)
                seen += 1
        tiles = WGMMA_CONV_TILES   # and each one's fused-shortcut instantiation
        assert seen == len(tiles) + sum(map(shortcut_applies, tiles))
    # ptxas serialises wgmma (and says so, C7515/C7520) when the accumulators are touched while in flight.
    assert "Potential Performance Loss" not in report, report


def blocks_by_registers(registers: int, threads: int) -> int:
    """Blocks per SM that `registers` per thread allow (the CUDA occupancy calculator's rule,
    cudaOccMaxBlocksPerSMRegsLimit in cuda_occupancy.h): a warp holds its registers in units of 256 (8 per
    thread), each of the SM's 4 sub-partitions has 16384 of its 65536, and a block's warps are resident
    together. (The plain product registers x threads x blocks <= 65536 passed 113 registers for two blocks
    of 288 threads; this rule allows 96, what ptxas gives such launch bounds.)"""
    per_warp = -(-registers // 8) * 8 * 32
    return (16384 // per_warp) * 4 // -(-threads // 32)


def test_blocks_by_registers_follows_the_occupancy_rule():
    assert blocks_by_registers(128, 256) == 2 and blocks_by_registers(129, 256) == 1   # 136 x 32 x 16 > 65536
    assert blocks_by_registers(96, 288) == 2 and blocks_by_registers(97, 288) == 1   # 5 or 4 warps per quarter
    assert blocks_by_registers(113, 288) == 1   # the plain product's false pass: 113 x 288 x 2 = 65088
    assert blocks_by_registers(168, 288) == 1 and blocks_by_registers(169, 288) == 0   # 9 warps, 3 or 2 per quarter
    assert blocks_by_registers(255, 256) == 1 and blocks_by_registers(64, 128) == 8

def _find_nvrtc():
    """libnvrtc ($FUSEDRESNET_NVRTC, the CUDA toolkit or the nvidia-cuda-nvrtc wheel), if any is here."""
    import ctypes
    import ctypes.util
    import glob
    import os
    import site
    candidates = [os.environ.get("FUSEDRESNET_NVRTC"), ctypes.util.find_library("nvrtc")]
    for root in site.getsitepackages() + [site.getusersitepackages()]:
        candidates += sorted(glob.glob(f"{root}/nvidia/*/lib/libnvrtc.so*"))
    candidates += sorted(glob.glob("/usr/local/cuda*/lib64/libnvrtc.so*"))
    for path in filter(None, candidates):
        if "builtins" in path or ".alt." in path:
            continue
        try:
            # libnvrtc dlopens its builtins library by name: load the one beside it first.
            for builtins in sorted(glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so*"))):
                if ".alt." not in builtins:
                    ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def _nvrtc_compile(arch: str) -> dict | None:
    """NVRTC's compile of the engine's translation unit for `arch`, exactly as the launcher asks for it:
    the result code, the log, which name expressions were lowered, the cubin's size and the PTX.
    None when no libnvrtc is here."""
    import ctypes
    nvrtc = _find_nvrtc()
    if nvrtc is None:
        return None
    program = ctypes.c_void_p()
    created = nvrtc.nvrtcCreateProgram(ctypes.byref(program), source_text(arch).encode(), b"fusedresnet.cu", 0,
                                       None, None)
    assert created == 0
    names = name_expressions(arch)
    for name in names:
        assert nvrtc.nvrtcAddNameExpression(program, name.encode()) == 0
    options = [o.encode() for o in nvrtc_options(arch)]
    result = nvrtc.nvrtcCompileProgram(program, len(options), (ctypes.c_char_p * len(options))(*options))
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(program, log)
    compiled = {"result": result, "log": log.value.decode(), "names": names}
    if result != 0:
        return compiled
    lowered = ctypes.c_char_p()
    compiled["not_lowered"] = [name for name in names
                               if nvrtc.nvrtcGetLoweredName(program, name.encode(), ctypes.byref(lowered)) != 0]
    cubin_size, ptx_size = ctypes.c_size_t(), ctypes.c_size_t()
    compiled["cubin_size"] = cubin_size.value if nvrtc.nvrtcGetCUBINSize(program, ctypes.byref(cubin_size)) == 0 \
        else 0
    assert nvrtc.nvrtcGetPTXSize(program, ctypes.byref(ptx_size)) == 0
    ptx = ctypes.create_string_buffer(ptx_size.value)
    assert nvrtc.nvrtcGetPTX(program, ptx) == 0
    compiled["ptx"] = ptx.value.decode()
    return compiled


@pytest.mark.parametrize("arch", ARCHS)
def test_kernels_compile_under_nvrtc_like_the_engine(arch):
    """The exact compile of the engine for `arch`: NVRTC, the launcher's options, every name expression lowered.

    mma path: what CuPy's RawModule hands NVRTC (our options, -ftz=true, the architecture);
    sm_90a: what nvrtc_build.compile_cubin hands it (the same list).
    NVRTC runs in a process of its own: should it crash (abort, segfault), this test fails and says so,
    and the rest of the suite goes on.
    """
    import concurrent.futures
    import multiprocessing
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            compiled = pool.submit(_nvrtc_compile, arch).result()
        except concurrent.futures.process.BrokenProcessPool as crash:
            pytest.fail(f"NVRTC's process died compiling the engine for {arch}: {crash}")
    if compiled is None:
        pytest.skip("libnvrtc not found (CUDA toolkit or the nvidia-cuda-nvrtc wheel)")
    names, log = compiled["names"], compiled["log"]
    assert compiled["result"] == 0, log
    assert "warning" not in log, log
    assert not compiled["not_lowered"], compiled["not_lowered"]
    assert compiled["cubin_size"] > 0
    # ... among them every kernel the engine serves on this architecture's paths (with the committed table)
    import json

    from fusedresnet.kernels.configs import MIXED, TUNED_PLANS, load_tuned_plans, served_name_expressions
    device = json.loads(TUNED_PLANS.read_text())["device"]
    for path in ((MIXED, "wgmma") if arch == WGMMA_ARCH else ("mma",)):
        for bindings in (True, False):
            served = served_name_expressions(arch if arch == WGMMA_ARCH else None, path,
                                             load_tuned_plans(device, path), bindings)
            assert set(served) <= set(names), (path, set(served) - set(names))
    # Programmatic dependent launch (common.cuh pdl_begin): every kernel of a cc >= 9.0 module waits for
    # the kernels before it (griddepcontrol.wait, once per kernel, inlined); none of an sm_8x module does.
    ptx = compiled["ptx"]
    entries = len(re.findall(r"^\.(?:visible|weak) \.entry ", ptx, re.M))
    assert entries == len(names)
    pdl = int(arch.removeprefix("sm_").rstrip("a")) >= 90
    assert ptx.count("griddepcontrol.wait;") == (entries if pdl else 0)
    # ... and triggers its dependents once on every path: one call site per kernel, two in the persistent
    # conv3x3_patch_wgmma (before the last tile's epilogue, on both of its loop's exits)
    trigger_sites = entries + sum(name.startswith("conv3x3_patch_wgmma<") for name in names)
    assert ptx.count("griddepcontrol.launch_dependents;") == (trigger_sites if pdl else 0)


def test_wgmma_stem_is_compiled_for_sm_90a_only_and_its_blocks_fit_an_sm():
    """stem_wgmma.cu: in the sm_90a module only; SW_BLOCKS_PER_SM blocks fit the H100's 228 KB of shared
    memory per SM (1 KB of it reserved per block)."""
    from fusedresnet.kernels.configs import GEOMETRY, STEM_POOL_WGMMA_KERNELS
    names = set(STEM_POOL_WGMMA_KERNELS.values())
    assert names <= set(name_expressions(WGMMA_ARCH)) and not names & set(name_expressions("sm_90"))
    assert "// ---- stem_wgmma.cu ----" in source_text(WGMMA_ARCH)
    sm, reserved = GEOMETRY["SM_SMEM_BYTES"], GEOMETRY["SM_BLOCK_RESERVED_SMEM"]
    assert STEM_WGMMA_BLOCKS_PER_SM * (STEM_WGMMA_SMEM_BYTES + reserved) <= sm
    assert STEM_WGMMA_SMEM_BYTES <= sm - reserved
    assert STEM_WGMMA_THREADS % 128 == 0   # whole warpgroups (the registers: the compile test)
    # one pooled tile's stem region fits the GEMM rows; 56 x 56 pooled maps tile exactly (no idle rows)
    assert (2 * GEOMETRY["SW_PH"] + 1) * (2 * GEOMETRY["SW_PW"] + 1) <= GEOMETRY["SW_M"]
    assert 56 % GEOMETRY["SW_PH"] == 0 and 56 % GEOMETRY["SW_PW"] == 0


def test_warp_specialised_wgmma_tiles_live_in_kernels_dev_fit_an_sm_and_are_never_served():
    """conv_wgmma_ws (kernels/dev/conv_wgmma_ws.cu, v2 of conv_wgmma, never chosen by the tuner): "ws" labels,
    one producer warpgroup on top of the consumers, the ring plus two 8-byte mbarriers per stage within the
    227 KB a block may have; in no module the engine or the tuner compiles, no tuned table names one."""
    from fusedresnet.kernels.configs import GEOMETRY, tile_by_label, tile_family
    from fusedresnet.kernels.dev import DEV_SOURCES, dev_name_expressions
    from fusedresnet.kernels.dev.conv_wgmma_ws import SOURCE, TILES
    assert 2 <= len(TILES) <= 4 and SOURCE in DEV_SOURCES
    assert dev_name_expressions()[SOURCE] == [t.name_expression for t in TILES]
    labels = [t.label for t in TILES]
    assert len(set(labels)) == len(labels) and all(label.startswith("ws") for label in labels)
    names = {t.name_expression for t in TILES}
    assert all(n.startswith("conv_wgmma_ws<") for n in names) and len(names) == len(TILES)
    assert not names & (set(name_expressions(WGMMA_ARCH)) | set(name_expressions("sm_90")))
    assert "conv_wgmma_ws(" not in source_text(WGMMA_ARCH) and "conv_wgmma_ws(" in SOURCE.read_text()
    for t in TILES:
        assert tile_by_label(t.label) is None and tile_family(t) == "wgmma" and not t.measured
        assert t.threads == (t.warpgroups + 1) * 128
        ring = t.stages * (t.bm + t.bn) * GEOMETRY["BK"] * 2
        sm, reserved = GEOMETRY["SM_SMEM_BYTES"], GEOMETRY["SM_BLOCK_RESERVED_SMEM"]
        assert t.smem_bytes == ring + GEOMETRY["WGMMA_SMEM_ALIGN"] + 16 * t.stages <= sm - reserved
        assert t.blocks_per_sm * (t.smem_bytes + reserved) <= sm


@needs_nvcc
def test_dev_kernels_compile_for_sm_90a_without_warnings_or_spills(tmp_path):
    """Every experiment of kernels/dev/ builds with the served sources as its runner builds it
    (configs.source_text with dev_sources), warnings as errors, its registers within one block per SM. Only the
    dev kernels are instantiated: the served ones compile in the test above."""
    from fusedresnet.kernels.dev import DEV_SOURCES, dev_name_expressions
    names = [name for names in dev_name_expressions().values() for name in names]
    # (177: a constant of a served kernel that no dev kernel uses is declared but never referenced)
    report = nvcc_report(tmp_path, WGMMA_ARCH, source_text(WGMMA_ARCH, DEV_SOURCES), names, "-diag-suppress", "177")
    blocks = [b for b in report.split("Function properties for ")[1:] if b.startswith("_Z13conv_wgmma_ws")]
    assert len(blocks) == len(names), report
    for block in blocks:
        assert " 0 bytes spill stores" in block, block
        assert blocks_by_registers(int(re.search(r"Used (\d+) registers", block).group(1)), 384) >= 1, block
    assert "Potential Performance Loss" not in report, report


def test_cluster_splitk_tiles_are_the_plain_tiles_again_and_their_staged_tile_fits_the_ring():
    """conv_wgmma's CLUSTER_SPLITK instantiations ("wc" labels, v3): one per plain conv_wgmma tile, same
    shape, shared memory and blocks per SM; sm_90a only; never an untuned choice; the fp32 tile each slice
    stages (cluster_stage_bytes, [BM][BN + pad] floats) fits the ring it overwrites; rows padded so that
    the four fragment rows of one half-warp's float2 stores fall in distinct banks."""
    from fusedresnet.kernels.configs import CLUSTER_SPLITK_MAX, GEOMETRY, conv_tiles, smem_bytes, tile_by_label
    plain = [t for t in WGMMA_TILES if not t.warp_specialized]
    assert len(WGMMA_CLUSTER_TILES) == len(plain)
    wgmma_90a, names_90 = set(name_expressions(WGMMA_ARCH)), set(name_expressions("sm_90"))
    for c, t in zip(WGMMA_CLUSTER_TILES, plain):
        assert c.label == "wc" + t.label.removeprefix("wg") and tile_by_label(c.label) is c
        assert (c.bm, c.bn, c.warpgroups, c.stages, c.smem_bytes, c.blocks_per_sm, c.threads) == (
            t.bm, t.bn, t.warpgroups, t.stages, t.smem_bytes, t.blocks_per_sm, t.threads)
        assert c.name_expression == f"conv_wgmma<{t.bm},{t.bn},{t.warpgroups},{t.stages},Schedule::CLUSTER_SPLIT_K>"
        assert c.name_expression in wgmma_90a and c.name_expression not in names_90
        assert shortcut_name_expression(c) == (
            f"conv_wgmma<{t.bm},{t.bn},{t.warpgroups},{t.stages},Schedule::CLUSTER_SPLIT_K,ConvInput::FP16_NHWC_FUSED_SHORTCUT>")
        ring = t.stages * (t.bm + t.bn) * GEOMETRY["BK"] * 2
        assert smem_bytes("cluster_stage_bytes", BM=c.bm, BN=c.bn) == c.bm * (c.bn + 8) * 4 <= ring, c.label
        assert c not in conv_tiles("wgmma") + conv_tiles("mixed")
    # a half-warp's float2 stores: rows g = 0..3 at words g * (BN + pad) + 2 t4, BN a multiple of 32
    assert GEOMETRY["CLUSTER_STAGE_PAD"] % 32 in (8, 24)
    assert CLUSTER_SPLITK_MAX == 8   # the portable cluster size: no non-portable attribute needed


def test_persistent_tiles_are_plain_tiles_that_run_whole_tiles_from_a_capped_grid():
    """conv_wgmma's PERSISTENT instantiations ("wp" labels): plain tiles again (shape, shared memory, blocks
    per SM), sm_90a only, never an untuned choice; a plan runs every tile unsplit (grid.x: the tiles, split-K
    refused), no fused shortcut."""
    from fusedresnet.kernels.configs import (
        WGMMA_PERSISTENT_TILES,
        ConvPlan,
        conv_tiles,
        make_plan,
        runs_persistent,
        tile_by_label,
    )
    assert 2 <= len(WGMMA_PERSISTENT_TILES) <= 6
    plain = {t.label: t for t in WGMMA_TILES}
    wgmma_90a, names_90 = set(name_expressions(WGMMA_ARCH)), set(name_expressions("sm_90"))
    for t in WGMMA_PERSISTENT_TILES:
        twin = plain["wg" + t.label.removeprefix("wp")]
        assert runs_persistent(t) and not runs_persistent(twin) and tile_by_label(t.label) is t
        assert (t.bm, t.bn, t.warpgroups, t.stages, t.smem_bytes, t.blocks_per_sm, t.threads) == (
            twin.bm, twin.bn, twin.warpgroups, twin.stages, twin.smem_bytes, twin.blocks_per_sm, twin.threads)
        assert t.name_expression == f"conv_wgmma<{t.bm},{t.bn},{t.warpgroups},{t.stages},Schedule::PERSISTENT>"
        assert not shortcut_applies(t) and shortcut_applies(twin)
        assert t.name_expression in wgmma_90a and t.name_expression not in names_90
        assert t not in conv_tiles("wgmma") + conv_tiles("mixed")
        # layer2.0's stride-2 conv at batch 128: M = 128 * 28 * 28, K = 128, 9 k-tiles
        plan = make_plan(t, 1, 100352, 128, 9)
        assert plan.grid == (-(-100352 // t.bm) * -(-128 // t.bn), 1, 1) and plan.splits == 1
        assert plan.k_tiles_per_split == 9 and plan.workspace_floats(100352 * 128) == 0
        with pytest.raises(ValueError, match="no split-K"):
            make_plan(t, 2, 100352, 128, 9)
        with pytest.raises(ValueError, match="no split-K"):   # a plan built by hand (the check harness's)
            ConvPlan(t, 2, 5, plan.grid)


def test_tma_tiles_are_persistent_sm_90a_tiles_with_a_producer_warp_and_a_twin_without_cuda_bindings():
    """conv_wgmma_tma's instantiations ("wt" labels, v6): persistent (whole tiles from a capped grid), a
    producer warp beside the consumer warpgroups, conv_wgmma_ws's ring and mbarriers in shared memory; sm_90a
    only, never an untuned choice, no fused shortcut; without cuda.bindings a tuned one runs on its "wp" twin
    (else its "wg" one) of the same shape."""
    from fusedresnet.kernels.configs import (
        GEOMETRY,
        WGMMA_TMA_TILES,
        conv_tiles,
        loads_by_tma,
        make_plan,
        runs_persistent,
        smem_bytes,
        tile_by_label,
        without_cuda_bindings,
    )
    assert 2 <= len(WGMMA_TMA_TILES) <= 9
    wgmma_90a, names_90 = set(name_expressions(WGMMA_ARCH)), set(name_expressions("sm_90"))
    labels = [t.label for t in WGMMA_TMA_TILES]
    assert len(set(labels)) == len(labels)
    for t in WGMMA_TMA_TILES:
        kind, vec = "wq" if t.pingpong else "wt", "v" if t.vec_epilogue else ""
        assert t.label == f"{kind}{t.bm}x{t.bn}g{t.warpgroups}s{t.stages}{vec}" and tile_by_label(t.label) is t
        assert loads_by_tma(t) and runs_persistent(t) and not shortcut_applies(t)
        assert t.threads == t.warpgroups * 128 + 32 == t.warpgroups * 128 + GEOMETRY["TMA_PRODUCER_THREADS"]
        # the ring of BM + BN rows of 128 bytes per stage, the 1024-byte alignment, two 8-byte barriers per stage
        assert t.smem_bytes == t.stages * (t.bm + t.bn) * 128 + 1024 + t.stages * 16
        assert t.smem_bytes == smem_bytes("wgmma_ws", BM=t.bm, BN=t.bn, STAGES=t.stages)
        names = ("TMA_PINGPONG" if t.pingpong else "TMA_WARP_SPECIALIZED", "VEC16" if t.vec_epilogue else "FRAGMENTS")
        assert t.name_expression == (f"conv_wgmma_tma<{t.bm},{t.bn},{t.warpgroups},{t.stages},Schedule::{names[0]},"
                                     f"Epilogue::{names[1]}>")
        assert t.name_expression in wgmma_90a and t.name_expression not in names_90
        assert t not in conv_tiles("wgmma") + conv_tiles("mixed")
        twin = without_cuda_bindings(t)
        assert not loads_by_tma(twin) and twin.label[2:] == t.label[2:].removesuffix("v")
        assert twin.label[:2] in ("wp", "wg")
        plan = make_plan(t, 1, 100352, 128, 9)   # layer2.0's stride-2 conv at batch 128
        assert plan.grid == (-(-100352 // t.bm) * -(-128 // t.bn), 1, 1) and plan.splits == 1
    tma = Schedule.TMA_WARP_SPECIALIZED
    with pytest.raises(ValueError, match="no cp.async twin"):   # no wp64x64g1s5 or wg64x64g1s5 tile
        without_cuda_bindings(WgmmaConfig(64, 64, 1, 5, blocks_per_sm=2, schedule=tma))
    with pytest.raises(ValueError, match="launch bounds"):   # two 97 KB blocks fit: the launch bounds ask two
        WgmmaConfig(128, 128, 2, 3, blocks_per_sm=1, schedule=tma)
    with pytest.raises(ValueError, match="TMA_PINGPONG schedule takes two warpgroups"):
        WgmmaConfig(128, 128, 1, 4, schedule=Schedule.TMA_PINGPONG)
    for schedule in set(Schedule) - {tma}:   # the 16-byte epilogue is the TMA warp-specialised tiles' only
        with pytest.raises(ValueError, match=f"the {schedule.name} schedule has no VEC16 epilogue"):
            WgmmaConfig(128, 128, 2, 4, schedule=schedule, epilogue=Epilogue.VEC16)


def test_wgmma_schedules_and_epilogues_have_names_and_the_labels_come_from_them():
    """Each wgmma tile names its schedule (configs.Schedule) and its epilogue (configs.Epilogue); its label is
    the schedule's prefix, the shape and the epilogue's suffix, the labels of kernels/tuned_plans.json."""
    from fusedresnet.kernels.configs import SCHEDULE_EPILOGUES, WGMMA_CONV_TILES, tile_by_label
    assert {s.name: s.value for s in Schedule} == {
        "MULTISTAGE": "wg", "CLUSTER_SPLIT_K": "wc", "PERSISTENT": "wp", "TMA_WARP_SPECIALIZED": "wt",
        "TMA_PINGPONG": "wq", "CP_ASYNC_WARP_SPECIALIZED": "ws"}
    assert {e.name: e.value for e in Epilogue} == {"FRAGMENTS": "", "VEC16": "v"}
    for t in WGMMA_CONV_TILES:
        assert t.label == f"{t.schedule.value}{t.bm}x{t.bn}g{t.warpgroups}s{t.stages}{t.epilogue.value}"
        assert t.epilogue in SCHEDULE_EPILOGUES[t.schedule]
    served = {t.schedule for t in WGMMA_CONV_TILES}
    assert served == set(Schedule) - {Schedule.CP_ASYNC_WARP_SPECIALIZED}   # that one lives in kernels/dev
    assert tile_by_label("wt128x128g2s4v").schedule is Schedule.TMA_WARP_SPECIALIZED
    assert tile_by_label("wt128x128g2s4v").epilogue is Epilogue.VEC16
    assert tile_by_label("wq128x128g2s6").schedule is Schedule.TMA_PINGPONG


def test_kernel_inputs_have_names_on_both_sides_and_the_name_expressions_come_from_them():
    """conv_implicit_gemm / conv_wgmma take a ConvInput, the stem kernels a StemInput: C++ enum classes generated
    on every target from configs' enums, whose names the .cu files and the name expressions spell."""
    from fusedresnet.kernels.configs import (
        ARCHS,
        CONV_TILES,
        STEM_KERNELS,
        STEM_POOL_KERNELS,
        STEM_POOL_WGMMA_KERNELS,
        STEM_TILES,
        ConvInput,
        StemInput,
        geometry_preamble,
    )
    assert [c.name for c in ConvInput] == ["FP16_NHWC", "FP16_NHWC_FUSED_SHORTCUT", "STEM_UINT8_NHWC",
                                           "STEM_FP32_NCHW"]
    assert {s.name: s.value for s in StemInput} == {"UINT8_NHWC": "uint8", "FP32_NCHW": "float32"}
    assert STEM_TILES["uint8"].input is ConvInput.STEM_UINT8_NHWC
    assert STEM_TILES["float32"].name_expression == "conv_implicit_gemm<128,64,4,2,3,ConvInput::STEM_FP32_NCHW>"
    assert STEM_KERNELS == {"uint8": "stem_conv7x7s2<StemInput::UINT8_NHWC>",
                            "float32": "stem_conv7x7s2<StemInput::FP32_NCHW>"}
    assert STEM_POOL_KERNELS["float32"] == "stem_pool_conv7x7s2<StemInput::FP32_NCHW>"
    assert STEM_POOL_WGMMA_KERNELS["uint8"] == "stem_pool_wgmma<StemInput::UINT8_NHWC>"
    t = CONV_TILES[0]
    assert t.name_expression == (f"conv_implicit_gemm<{t.bm},{t.bn},{t.warps_m},{t.warps_n},{t.stages},"
                                 "ConvInput::FP16_NHWC>")
    assert shortcut_name_expression(t) == t.name_expression.replace("FP16_NHWC", "FP16_NHWC_FUSED_SHORTCUT")
    assert not any(shortcut_applies(stem) for stem in STEM_TILES.values())
    for arch in ARCHS:
        preamble = geometry_preamble(arch)
        for enum in (ConvInput, StemInput):
            declared = re.search(rf"enum class {enum.__name__} : int {{ (.*) }};", preamble).group(1)
            assert declared == ", ".join(f"{e.name} = {i}" for i, e in enumerate(enum)), arch
    spelled = set()
    for path in (*KERNEL_DIR.glob("*.cu"), *KERNEL_DIR.glob("*.cuh")):
        spelled |= set(re.findall(r"\b(ConvInput|StemInput)::(\w+)", path.read_text()))
    assert {"ConvInput", "StemInput"} == {enum for enum, _ in spelled}
    assert all(name in {"ConvInput": ConvInput, "StemInput": StemInput}[enum].__members__ for enum, name in spelled)


def test_every_wgmma_tile_fits_its_blocks_per_sm_and_the_launch_bounds_ask_for_them():
    """configs' blocks_per_sm (the cost model's occupancy) fits an SM's shared memory for every wgmma tile,
    and conv_wgmma's launch bounds (wgmma_min_blocks: two wherever two rings fit) ask ptxas for the
    registers of min(blocks_per_sm, 2) blocks; the registers themselves: the nvcc test above."""
    from fusedresnet.kernels.configs import GEOMETRY, WGMMA_TMA_TILES
    sm, reserved = GEOMETRY["SM_SMEM_BYTES"], GEOMETRY["SM_BLOCK_RESERVED_SMEM"]
    source = (KERNEL_DIR / "conv_wgmma.cu").read_text()
    # both launch bounds go through configs' one rule (SMEM_BYTES "wgmma_launch_blocks", pasted as C++)
    assert "__launch_bounds__(WGS * 128, wgmma_min_blocks(BM, BN, STAGES))" in source
    assert "__launch_bounds__(WGS * 128 + TMA_PRODUCER_THREADS, wgmma_tma_min_blocks(BM, BN, STAGES))" in source
    assert "return wgmma_launch_blocks(wgmma_smem_bytes(bm, bn, stages));" in source
    assert "return wgmma_launch_blocks(wgmma_ws_smem_bytes(bm, bn, stages));" in source
    assert "SM_SMEM_BYTES" not in source
    for t in WGMMA_TILES + WGMMA_TMA_TILES:
        assert t.blocks_per_sm * (t.smem_bytes + reserved) <= sm, t.label
        two_fit = 2 * (t.smem_bytes + reserved) <= sm
        assert t.launch_blocks == (1 if t.warp_specialized else 2 if two_fit else 1), t.label
        if not t.warp_specialized:
            assert t.launch_blocks == min(t.blocks_per_sm, 2), t.label
    for t in WGMMA_TMA_TILES:   # persistent: as many blocks per SM as the launch bounds ask registers for
        assert t.blocks_per_sm == t.launch_blocks, t.label


def test_patch_wgmma_tiles_are_sm_90a_only_and_their_shared_memory_is_the_filter_and_the_patches():
    """conv3x3_patch_wgmma: in the sm_90a module only; per block the 9-tap filter slice (9 x 64 rows of 128
    bytes) and STAGES patches of BM + 2(W+2) + 2 rows rounded up to 8, plus the 1024-byte alignment; tiles
    whose patches do not fit 227 KB at a width are not used there."""
    from fusedresnet.kernels.configs import PATCH_WGMMA_TILES, patch_wgmma_applies, tile_by_label, tile_family
    names = {t.name_expression for t in PATCH_WGMMA_TILES}
    assert names <= set(name_expressions(WGMMA_ARCH)) and not names & set(name_expressions("sm_90"))
    assert "// ---- conv3x3_patch_wgmma.cu ----" in source_text(WGMMA_ARCH)
    by_label = {t.label: t for t in PATCH_WGMMA_TILES}
    assert len(by_label) == len(PATCH_WGMMA_TILES)
    for t in PATCH_WGMMA_TILES:
        assert tile_by_label(t.label) is t and tile_family(t) == "wgmma" and t.threads == 128 * t.warpgroups
    # the 16-byte epilogue accesses (VEC) change no shared memory
    assert by_label["pwg128g2s4v1"].smem_for(56) == by_label["pwg128g2s4v2"].smem_for(56) == by_label[
        "pwg128g2s4"].smem_for(56)
    assert by_label["pwg128g2s4v2"].name_expression == "conv3x3_patch_wgmma<128,2,4,2>"
    # layer1 (W = 56): rows 128 + 116 + 2 = 246 -> 248 (31744 bytes); 256 + 118 = 374 -> 376 (48128); 64 -> 184
    filter_bytes = 9 * 64 * 128
    assert by_label["pwg128g2s3"].smem_for(56) == 1024 + filter_bytes + 3 * 31744 == 169984
    assert by_label["pwg256g2s3"].smem_for(56) == 1024 + filter_bytes + 3 * 48128 == 219136
    assert by_label["pwg64g1s4"].smem_for(56) == 1024 + filter_bytes + 4 * 184 * 128
    limit = 227 * 1024
    for t in PATCH_WGMMA_TILES:
        assert t.smem_for(56) <= limit and t.smem_bytes == limit
        assert patch_wgmma_applies(t, 64, 64, 3, 1, 1, 56)
        assert not patch_wgmma_applies(t, 128, 128, 3, 1, 1, 28)     # C = 64 only (the filter stays resident)
        assert not patch_wgmma_applies(t, 64, 128, 3, 2, 1, 56)      # stride 1 only
        assert not patch_wgmma_applies(t, 64, 64, 3, 1, 1, 400)      # the patches no longer fit
    assert by_label["pwg256g2s3"].smem_for(112) > limit >= by_label["pwg128g2s3"].smem_for(112)


def test_untuned_plans_put_layer1_on_the_patch_wgmma_kernel_on_the_sm_90a_paths_only():
    """Measured on the H100 (NOTES.md outcomes 15 and 43, layer1 at batch 1-256): conv3x3_patch_wgmma beat
    every other tile and split-K; BM 64 at batch 1 (27 tiles of 128 for 132 SMs), from batch 8 on BM 128
    with the 16-byte epilogue stores (v1: the fastest at 128 and 256, within 5% of v2 at 8 and 32)."""
    from fusedresnet.kernels.configs import MIXED, untuned_plan
    sms = 132
    expected = {1: "pwg64g1s4", 4: "pwg64g1s4", 8: "pwg128g2s4v1", 32: "pwg128g2s4v1", 128: "pwg128g2s4v1",
                256: "pwg128g2s4v1"}
    for n, label in expected.items():
        for path in (MIXED, "wgmma"):
            plan = untuned_plan(n, 56, 56, 64, 64, 3, 1, 1, sms, path)
            assert plan.tile.label == label and plan.splits == 1, (n, path, plan)
        assert not untuned_plan(n, 56, 56, 64, 64, 3, 1, 1, sms, "mma").tile.label.startswith("pwg")
        # not for layer2 (C = 128), the stride-2 conv, or an image too wide for the patches
        for args in ((28, 28, 128, 128, 3, 1, 1), (56, 56, 64, 128, 3, 2, 1), (56, 400, 64, 64, 3, 1, 1)):
            assert not untuned_plan(n, *args, sms, MIXED).tile.label.startswith("pwg"), (n, args)
    # 97x130 input: layer1 is 25x33, still the patch kernel
    assert untuned_plan(5, 25, 33, 64, 64, 3, 1, 1, sms, MIXED).tile.label.startswith("pwg")


def test_a_fused_shortcut_has_its_own_plan_key_and_never_a_patch_tile():
    """conv2 + the fused projection (kernels/loaders.cuh) is tuned apart from the plain conv2 of that shape, and
    untuned it plans on the implicit-GEMM tiles over conv2's k-tiles plus the projection's."""
    from fusedresnet.kernels.configs import (
        CONV_TILES,
        MIXED,
        PATCH_TILES,
        PATCH_WGMMA_TILES,
        WGMMA_TILES,
        plan_key,
        shortcut_applies,
        untuned_plan,
    )
    # the implicit-GEMM kernels have it (conv_wgmma_ws and the patch kernels do not)
    assert all(map(shortcut_applies, CONV_TILES)) and not any(map(shortcut_applies, PATCH_TILES + PATCH_WGMMA_TILES))
    assert [shortcut_applies(t) for t in WGMMA_TILES] == [not t.warp_specialized for t in WGMMA_TILES]
    assert plan_key(128, 28, 28, 128, 128, 3, 1) == "n128_h28_w28_c128_k128_r3_s1"
    assert plan_key(128, 28, 28, 128, 128, 3, 1, 64) == "n128_h28_w28_c128_k128_r3_s1_sc64"
    for path in (MIXED, "wgmma", "mma"):
        for n in (1, 32, 128):
            for hw, c in ((28, 128), (14, 256), (7, 512)):
                plan = untuned_plan(n, hw, hw, c, c, 3, 1, 1, 132, path, shortcut_c=c // 2)
                assert shortcut_applies(plan.tile), (path, n, hw, plan)
                assert plan.splits * plan.k_tiles_per_split >= (9 * c + c // 2) // 64 > (plan.splits - 1) * \
                    plan.k_tiles_per_split, (path, n, hw, plan)


def test_conv_path_is_mixed_on_cc_9_0_only_and_one_family_can_be_forced(monkeypatch):
    from fusedresnet.kernels.configs import CONV_PATH_ENV, MIXED, conv_path
    monkeypatch.delenv(CONV_PATH_ENV, raising=False)
    assert conv_path((9, 0)) == MIXED
    assert [conv_path(cc) for cc in ((8, 0), (8, 6), (8, 9), (10, 0), (12, 0))] == ["mma"] * 5
    monkeypatch.setenv(CONV_PATH_ENV, "mma")
    assert conv_path((9, 0)) == "mma"
    assert conv_path((9, 0), "wgmma") == "wgmma"          # an explicit argument beats the environment
    assert conv_path((9, 0), "auto") == MIXED
    monkeypatch.setenv(CONV_PATH_ENV, "wgmma")
    with pytest.raises(RuntimeError, match="compute capability 9.0"):
        conv_path((8, 9))                                  # never a silent fallback
    with pytest.raises(ValueError, match="auto, mma or wgmma"):
        conv_path((8, 9), MIXED)                           # mixed needs the sm_90a module too
    monkeypatch.setenv(CONV_PATH_ENV, "tensor")
    with pytest.raises(ValueError, match="auto, mma or wgmma"):
        conv_path((9, 0))


def test_untuned_mixed_plans_use_mma_sync_at_small_batch_and_for_1x1_and_wgmma_for_large_3x3():
    """The untuned rule of NOTES.md outcome 7 on an H100 (132 SMs), at the issue's batch sizes."""
    from fusedresnet.kernels.configs import MIXED, plan_default, tile_family
    sms = 132

    def family(n, p, c, k, r):
        return tile_family(plan_default(n * p * p, k, r * r * c // 64, r, sms, MIXED).tile)
    for n in (1, 8):   # every conv of the network is mma.sync at small batch
        for p, c, k, r in ((56, 64, 64, 3), (28, 128, 128, 3), (14, 256, 256, 3), (7, 512, 512, 3), (7, 256, 512, 1)):
            assert family(n, p, c, k, r) == "mma", (n, p, c, k, r)
    assert family(128, 56, 64, 64, 3) == family(128, 7, 512, 512, 3) == "wgmma"
    assert family(32, 56, 64, 64, 3) == family(32, 7, 512, 512, 3) == "wgmma"   # 28 M MAC per SM
    assert family(32, 14, 128, 256, 3) == "mma"            # the stride-2 3x3 convs at 32: 14 M
    assert family(256, 7, 256, 512, 1) == "mma"            # 1x1 downsample, 4 k-tiles
    # Untuned wgmma plans only use tiles whose efficiency was measured.
    for n in (32, 128, 256):
        tile = plan_default(n * 196, 256, 36, 3, sms, "wgmma").tile
        assert tile_family(tile) == "wgmma" and tile.measured


def test_tuned_table_gives_each_path_its_own_family_and_only_on_its_gpu(tmp_path):
    import json

    from fusedresnet.kernels.configs import MIXED, WGMMA_TILES, load_tuned_plans
    wg, mma, patch = WGMMA_TILES[2].label, "64x64w2x2s4", "patch8x16n64w4x2s4"
    plans = {
        "n128_h56_w56_c64_k64_r3_s1": {"tile": wg, "splits": 1, "family": "wgmma", "by_family": {
            "mma": {"tile": patch, "splits": 1}, "wgmma": {"tile": wg, "splits": 1}}},
        "n1_h7_w7_c512_k512_r3_s1": {"tile": mma, "splits": 12, "family": "mma", "by_family": {
            "mma": {"tile": mma, "splits": 12}, "wgmma": {"tile": wg, "splits": 6}}},
    }
    table = tmp_path / "tuned_plans.json"
    table.write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3", "families": ["mma", "wgmma"], "plans": plans}))
    device = "NVIDIA H100 80GB HBM3"
    mixed = load_tuned_plans(device, MIXED, table)
    assert [(t.label, s) for t, s in mixed.values()] == [(wg, 1), (mma, 12)]
    assert [(t.label, s) for t, s in load_tuned_plans(device, "mma", table).values()] == [(patch, 1), (mma, 12)]
    assert [(t.label, s) for t, s in load_tuned_plans(device, "wgmma", table).values()] == [(wg, 1), (wg, 6)]
    assert load_tuned_plans("NVIDIA H200", MIXED, table) == {}
    assert load_tuned_plans("NVIDIA A100-SXM4-80GB", "mma", table) == {}
    # A table that measured one family only has no mixed plans.
    table.write_text(json.dumps({"device": device, "families": ["mma"], "plans": {
        k: v["by_family"]["mma"] for k, v in plans.items()}}))
    assert load_tuned_plans(device, MIXED, table) == {} == load_tuned_plans(device, "wgmma", table)
    assert len(load_tuned_plans(device, "mma", table)) == 2
    # A table naming a tile that is not compiled is an error, not a silent cost-model plan.
    table.write_text(json.dumps({"device": device, "families": ["mma"], "plans": {
        "n1_h7_w7_c512_k512_r3_s1": {"tile": "256x256w9x9s9", "splits": 1}}}))
    with pytest.raises(ValueError, match="not compiled"):
        load_tuned_plans(device, "mma", table)


def test_committed_tuned_plans_apply_only_to_the_gpu_they_were_measured_on():
    import json

    from fusedresnet.kernels.configs import CONV_PATHS, MIXED, TUNED_PLANS, load_tuned_plans
    table = json.loads(TUNED_PLANS.read_text())
    device = table["device"]
    families = table.get("families", [table.get("conv_path", "mma")])
    for family in CONV_PATHS:
        assert (len(load_tuned_plans(device, family)) == len(table["plans"])) == (family in families)
    assert bool(load_tuned_plans(device, MIXED)) == (set(families) == set(CONV_PATHS))
    assert load_tuned_plans("NVIDIA A100-SXM4-80GB", families[0]) == {}


def test_sass_diff_keeps_instruction_and_control_words_and_drops_only_addresses(tmp_path):
    """kernels/sass_diff.py: the per-kernel SASS listing the refactor check compares (see its module doc)."""
    from fusedresnet.kernels.sass_diff import compare, split_listing
    sass = ("\tcode for sm_90a\n\t\tFunction : _Z1kILi3EEvPf\n\t.headerflags\t@\"EF_CUDA_SM90\"\n"
            "        /*0000*/                   LDC R1, c[0x0][0x28] ;             /* 0x00000a00ff017b82 */\n"
            "                                                                      /* 0x000fe20000000800 */\n"
            "        /*0010*/                   EXIT ;                             /* 0x000000000000794d */\n")
    usage = " Function _Z1kILi3EEvPf:\n  REG:10 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:536\n"
    listing = split_listing(sass, usage)
    assert listing == {"_Z1kILi3EEvPf": "resources: REG:10 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:536\n"
                       "LDC R1, c[0x0][0x28] ; /* 0x00000a00ff017b82 */\n/* 0x000fe20000000800 */\n"
                       "EXIT ; /* 0x000000000000794d */\n"}
    # Same code at other addresses compares equal; another control word (a stall count) does not.
    moved = split_listing(sass.replace("/*0000*/", "/*0100*/").replace("/*0010*/", "/*0110*/"), usage)
    stalled = split_listing(sass.replace("0x000fe20000000800", "0x000fe40000000800"), usage)
    assert moved == listing and stalled != listing
    for side, text in (("a", listing), ("b", moved), ("c", stalled)):
        (tmp_path / side / "sm_90a").mkdir(parents=True)
        (tmp_path / side / "sm_90a" / "k[3].sass").write_text(text["_Z1kILi3EEvPf"])
    assert compare(tmp_path / "a", tmp_path / "b") == 0
    assert compare(tmp_path / "a", tmp_path / "c") == 1


def test_a_cluster_splitk_plan_needs_no_workspace_and_falls_back_to_its_workspace_twin():
    """A "wc" plan reduces its slices in the cluster: no fp32 workspace; without cluster launches
    (`without_cuda_bindings`) it runs on the "wg" tile of the same shape, through the workspace."""
    from fusedresnet.kernels.configs import make_plan, without_cuda_bindings
    outputs = 7 * 7 * 512
    for c in WGMMA_CLUSTER_TILES:
        twin = without_cuda_bindings(c)
        assert twin in WGMMA_TILES and twin.label == "wg" + c.label.removeprefix("wc")
        assert (twin.bm, twin.bn, twin.warpgroups, twin.stages) == (c.bm, c.bn, c.warpgroups, c.stages)
        cluster_plan, twin_plan = make_plan(c, 4, 49, 512, 72), make_plan(twin, 4, 49, 512, 72)
        assert cluster_plan.cluster_splitk and not twin_plan.cluster_splitk
        assert cluster_plan.grid == twin_plan.grid and cluster_plan.splits == 4
        assert cluster_plan.workspace_floats(outputs) == 0 and twin_plan.workspace_floats(outputs) == 4 * outputs
        assert make_plan(twin, 1, 49, 512, 72).workspace_floats(outputs) == 0
    for t in WGMMA_TILES:
        assert without_cuda_bindings(t) is t


def _key_shape(key: str) -> tuple[int, ...]:
    """(n, h, w, c, k, r, stride, shortcut_c) of a tuned-table key such as n128_h14_w14_c256_k256_r3_s1_sc128."""
    fields = dict(re.findall(r"([a-z]+)(\d+)", key))
    return tuple(int(fields.get(name, 0)) for name in ("n", "h", "w", "c", "k", "r", "s", "sc"))


def test_served_kernels_are_those_the_tuned_plans_and_the_untuned_plans_can_choose():
    """What the engine compiles at load on each path (configs.served_name_expressions): the kernel of every
    plan in kernels/tuned_plans.json for its GPU, of every untuned plan (other batch sizes, input sizes and
    GPUs), the stem + max-pool of its module and the head; not the tuner's other candidates (the
    warp-specialised conv_wgmma_ws, which it never chose), which a library compiles only when asked."""
    import json

    from fusedresnet.kernels.configs import (
        MIXED,
        STEM_POOL_KERNELS,
        TUNED_PLANS,
        load_tuned_plans,
        path_arch,
        served_name_expressions,
        tile_by_label,
        untuned_plan,
    )
    table = json.loads(TUNED_PLANS.read_text())
    device = table["device"]

    def kernel(tile, shortcut_c):
        return shortcut_name_expression(tile) if shortcut_c else tile.name_expression

    for path in (MIXED, "wgmma", "mma"):
        arch = path_arch(path)
        served = served_name_expressions(arch, path, load_tuned_plans(device, path), True)
        assert len(set(served)) == len(served) and set(served) <= set(name_expressions(arch))
        assert not any(name.startswith("conv_wgmma_ws<") for name in served)
        for key, entry in table["plans"].items():
            chosen = entry if path == MIXED else entry["by_family"][path]
            assert kernel(tile_by_label(chosen["tile"]), _key_shape(key)[-1]) in served, (path, key)
            n, h, w, c, k, r, stride, shortcut_c = _key_shape(key)
            for batch in (1, 3, 5, 96, 200, n):   # untuned: batches outside the table, other input sizes
                for hw in ((h, w), (h + 3, w + 5)):
                    plan = untuned_plan(batch, *hw, c, k, r, stride, r // 2, 132, path, shortcut_c)
                    assert kernel(plan.tile, shortcut_c) in served, (path, batch, hw, key, plan.tile.label)
                    plan = untuned_plan(batch, *hw, c, k, r, stride, r // 2, 78, path, shortcut_c)   # an H20
                    assert kernel(plan.tile, shortcut_c) in served, (path, batch, hw, key, plan.tile.label)
        stems = ({"stem_pool_wgmma<StemInput::UINT8_NHWC>", "stem_pool_wgmma<StemInput::FP32_NCHW>"}
                 if arch == WGMMA_ARCH else set(STEM_POOL_KERNELS.values()))
        assert stems | {"avgpool_fc<8>", "splitk_epilogue"} <= set(served)
    # On the table's GPU (H100: 90 plans, all wgmma) the sm_90a module shrinks to less than half of the candidates
    mixed = served_name_expressions(WGMMA_ARCH, MIXED, load_tuned_plans(device, MIXED), True)
    assert len(mixed) < len(name_expressions(WGMMA_ARCH)) / 2
    # Without cuda.bindings the tuned "wc", "wt" and "wq" tiles are served by their twins: none of theirs compiled
    twins = served_name_expressions(WGMMA_ARCH, MIXED, load_tuned_plans(device, MIXED), False)
    assert not any(n.startswith("conv_wgmma_tma<") or "CLUSTER_SPLIT_K" in n
                   for n in twins)
    # another GPU: only what the untuned plans can choose
    other = served_name_expressions(WGMMA_ARCH, MIXED, load_tuned_plans("NVIDIA H200", MIXED), True)
    assert set(other) < set(mixed) and not any(n.startswith("conv_wgmma_tma<") for n in other)


class _CtypesNvrtc:
    """The calls of cupy_backends.cuda.libs.nvrtc that kernels/nvrtc_build.py makes, on libnvrtc through ctypes
    (CuPy needs a GPU to import; ctypes, like CuPy, lets other threads run during a call)."""

    class NVRTCError(RuntimeError):
        pass

    def __init__(self, lib):
        import ctypes
        self.lib, self.ctypes = lib, ctypes
        self.compiles = []

    def _check(self, result):
        if result != 0:
            raise self.NVRTCError(result)

    def getVersion(self):
        major, minor = self.ctypes.c_int(), self.ctypes.c_int()
        self._check(self.lib.nvrtcVersion(self.ctypes.byref(major), self.ctypes.byref(minor)))
        return major.value, minor.value

    def createProgram(self, source, name, headers, include_names):
        program = self.ctypes.c_void_p()
        self._check(self.lib.nvrtcCreateProgram(self.ctypes.byref(program), source.encode(), name.encode(), 0,
                                                None, None))
        return program

    def addNameExpression(self, program, name):
        self._check(self.lib.nvrtcAddNameExpression(program, name.encode()))

    def compileProgram(self, program, options):
        self.compiles.append(options)
        encoded = [o.encode() for o in options]
        array = (self.ctypes.c_char_p * len(encoded))(*encoded)
        self._check(self.lib.nvrtcCompileProgram(program, len(encoded), array))

    def getProgramLog(self, program):
        size = self.ctypes.c_size_t()
        self._check(self.lib.nvrtcGetProgramLogSize(program, self.ctypes.byref(size)))
        log = self.ctypes.create_string_buffer(size.value)
        self._check(self.lib.nvrtcGetProgramLog(program, log))
        return log.value.decode()

    def getCUBIN(self, program):
        size = self.ctypes.c_size_t()
        self._check(self.lib.nvrtcGetCUBINSize(program, self.ctypes.byref(size)))
        cubin = self.ctypes.create_string_buffer(size.value)
        self._check(self.lib.nvrtcGetCUBIN(program, cubin))
        return cubin.raw

    def getLoweredName(self, program, name):
        lowered = self.ctypes.c_char_p()
        self._check(self.lib.nvrtcGetLoweredName(program, name.encode(), self.ctypes.byref(lowered)))
        return lowered.value.decode()

    def destroyProgram(self, program):
        self._check(self.lib.nvrtcDestroyProgram(self.ctypes.byref(program)))


def test_kernel_cache_compiles_each_kernel_once_across_processes_and_reads_it_back(tmp_path):
    """kernels/nvrtc_build.py, the sm_90a build of the engine, with the real NVRTC: one program per kernel,
    compiled in parallel threads, each cubin with its lowered name on disk; two caches of the same source
    (Triton's instances of a model, in processes of their own) starting together compile each kernel once
    between them (a lock file per kernel) and get the same files; a changed source is another key."""
    import concurrent.futures

    from fusedresnet.kernels.nvrtc_build import KernelCache
    lib = _find_nvrtc()
    if lib is None:
        pytest.skip("libnvrtc not found (CUDA toolkit or the nvidia-cuda-nvrtc wheel)")
    names = ["splitk_epilogue", "avgpool_fc<8>", "maxpool_3x3s2"]
    source, options = source_text(WGMMA_ARCH), nvrtc_options(WGMMA_ARCH)
    first, second = _CtypesNvrtc(lib), _CtypesNvrtc(lib)
    caches = [KernelCache(source, options, nvrtc, tmp_path) for nvrtc in (first, second)]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda cache: cache.get(names, workers=3), caches))
    assert results[0] == results[1] and sorted(results[0]) == sorted(names)
    assert len(first.compiles) + len(second.compiles) == len(names)
    assert all(options == list(nvrtc_options(WGMMA_ARCH)) for options in first.compiles + second.compiles)
    lowered = {name: hit[1] for name, hit in results[0].items()}
    assert lowered["avgpool_fc<8>"].startswith("_Z10avgpool_fcILi8EE") and lowered["splitk_epilogue"].startswith("_Z")
    for cubin, _ in results[0].values():
        assert cubin.read_bytes()[:4] == b"\x7fELF" and cubin.parent == tmp_path
    again = _CtypesNvrtc(lib)
    assert KernelCache(source, options, again, tmp_path).get(names) == results[0] and not again.compiles
    changed = KernelCache(source + "\n// changed\n", options, again, tmp_path)
    assert changed.key(names[0]) != caches[0].key(names[0]) and changed.cached(names[0]) is None
    with pytest.raises(RuntimeError, match="failed to compile conv_wgmma<1,2,3,4>"):
        changed.get(["conv_wgmma<1,2,3,4>"])
