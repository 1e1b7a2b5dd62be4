"""Every CUDA source in kernels/ compiles for every architecture the engine supports (CPU only, no GPU).

`build.ARCHS`: sm_80, sm_86, sm_89 and sm_90 (the mma.sync path, compiled
by CuPy's RawModule) and sm_90a (the wgmma path, compiled by
`kernels/nvrtc_build.py`). For each, the translation unit is exactly what the
engine compiles (`build.source_text(arch)`, the same options) with every
kernel instantiation the launcher uses on that path:
- with nvcc (warnings as errors, no register spills in the matrix kernels, no
  serialised wgmma), plus a line that takes the address of each instantiation;
- with NVRTC, the library the engine compiles with (the CUDA toolkit's or the
  nvidia-cuda-nvrtc wheel's: this runs on a CPU-only machine), every name
  expression lowered.
A syntax error in a .cu file, or PTX that does not assemble for one target, cannot land.

These compiles are independent (one program per architecture and compiler, each single-threaded), so the
module runs them together, one per core (`compiles`), the slowest first; each test checks its own.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import re
import shutil
import subprocess

import pytest

from fusedresnet.kernels.build import (
    ARCHS,
    COMPILE_OPTIONS,
    HEADERS,
    KERNEL_DIR,
    SOURCES,
    WGMMA_ARCH,
    WGMMA_HEADERS,
    WGMMA_SOURCES,
    name_expressions,
    nvrtc_options,
    source_text,
)
from fusedresnet.kernels.geometry import STEM_WGMMA_BLOCKS_PER_SM, STEM_WGMMA_SMEM_BYTES, STEM_WGMMA_THREADS
from fusedresnet.kernels.nvrtc_build import default_workers
from fusedresnet.kernels.tiles import (
    WGMMA_CONV_TILES,
    WGMMA_TILES,
    Epilogue,
    Schedule,
    shortcut_applies,
)

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH: cannot compile the CUDA kernels here")


def test_every_cu_file_is_part_of_the_compiled_source():
    on_disk = sorted(p.name for p in KERNEL_DIR.glob("*.cu"))
    assert on_disk == sorted(SOURCES), "a .cu file in kernels/ is not listed in build.SOURCES (never compiled)"
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


def _nvcc_served(tmp_path, arch: str) -> str:
    """The report of the engine's translation unit for `arch` with every kernel the launcher uses."""
    return nvcc_report(tmp_path, arch, source_text(arch), name_expressions(arch))


def _nvcc_dev(tmp_path) -> str:
    """The report of kernels/dev/'s experiments after the served sources on sm_90a, only they instantiated.
    (177: a constant of a served kernel that no dev kernel uses is declared but never referenced)"""
    from fusedresnet.kernels.dev import DEV_SOURCES, dev_name_expressions
    names = [name for names in dev_name_expressions().values() for name in names]
    return nvcc_report(tmp_path, WGMMA_ARCH, source_text(WGMMA_ARCH, DEV_SOURCES), names, "-diag-suppress", "177")


def _nvrtc_in_a_process_of_its_own(arch: str) -> dict | None:
    """`_nvrtc_compile(arch)` in a spawned process: should NVRTC crash (abort, segfault), only this compile
    fails (BrokenProcessPool), and the rest of the suite goes on."""
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_nvrtc_compile, arch).result()


class _Compiles:
    """The module's expensive compiles, keyed ("nvcc", arch), ("nvrtc", arch) or ("nvcc-dev", WGMMA_ARCH):
    each one program of one single-threaded compiler (nvcc's subprocesses, or NVRTC in a process of its
    own), independent of the others, so they run `workers` at a time in threads that wait for them. What
    each compiles, with which options, and what its test checks of the result are those of one compile on
    its own; only the waiting is shared."""

    ORDER = ("nvrtc", "nvcc", "nvcc-dev")   # the slowest first (sm_90a, then NVRTC before nvcc)

    def __init__(self, tmp_path_factory, workers: int):
        self.tmp_path_factory = tmp_path_factory
        self.pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="compile")
        self.futures: dict[tuple[str, str], concurrent.futures.Future] = {}

    def _job(self, kind: str, arch: str):
        if kind == "nvrtc":
            return _nvrtc_in_a_process_of_its_own, (arch,)
        directory = self.tmp_path_factory.mktemp(f"{kind}-{arch}")
        return (_nvcc_dev, (directory,)) if kind == "nvcc-dev" else (_nvcc_served, (directory, arch))

    def start(self, keys):
        keys = sorted(set(keys) - set(self.futures),
                      key=lambda key: (key[1] != WGMMA_ARCH, self.ORDER.index(key[0]), key[1]))
        for key in keys:
            function, args = self._job(*key)
            self.futures[key] = self.pool.submit(function, *args)

    def result(self, kind: str, arch: str):
        """The compile's result (its exception raised here), started now if it was not yet."""
        self.start([(kind, arch)])
        return self.futures[kind, arch].result()

    def close(self):
        self.pool.shutdown(wait=True, cancel_futures=True)


_COMPILE_TESTS = {   # test function: its compile's kind (parametrised by arch unless the kind fixes it)
    "test_kernels_compile_for_arch_without_warnings_or_spills": "nvcc",
    "test_kernels_compile_under_nvrtc_like_the_engine": "nvrtc",
    "test_dev_kernels_compile_for_sm_90a_without_warnings_or_spills": "nvcc-dev",
}


@pytest.fixture(scope="module")
def compiles(request, tmp_path_factory):
    """Every compile that this session's selected tests of this module ask for, started together at the first
    one's request (a compile no selected test needs is never run)."""
    keys = []
    for item in request.session.items:
        kind = _COMPILE_TESTS.get(getattr(item, "originalname", None))
        if getattr(item, "module", None) is not request.module or kind is None:
            continue
        if kind.startswith("nvcc") and NVCC is None:   # (skipped)
            continue
        params = getattr(item, "callspec", None)
        keys.append((kind, params.params["arch"] if params is not None else WGMMA_ARCH))
    compiles = _Compiles(tmp_path_factory, default_workers())
    compiles.start(keys)
    yield compiles
    compiles.close()


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
def test_kernels_compile_for_arch_without_warnings_or_spills(arch, compiles):
    names = name_expressions(arch)
    report = compiles.result("nvcc", arch)
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
    # Every wgmma tile's registers fit the blocks per SM the cost model counts on (tiles blocks_per_sm).
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
def test_kernels_compile_under_nvrtc_like_the_engine(arch, compiles):
    """The exact compile of the engine for `arch`: NVRTC, the launcher's options, every name expression lowered.

    mma path: what CuPy's RawModule hands NVRTC (our options, -ftz=true, the architecture);
    sm_90a: what nvrtc_build.compile_cubin hands it (the same list).
    NVRTC runs in a process of its own: should it crash (abort, segfault), this test fails and says so,
    and the rest of the suite goes on.
    """
    try:
        compiled = compiles.result("nvrtc", arch)
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

    from fusedresnet.kernels.launch_choices import MIXED
    from fusedresnet.kernels.planner import committed_tuned_plans, load_tuned_plans, served_name_expressions
    for device in (json.loads(table.read_text())["device"] for table in committed_tuned_plans()):
        for path in ((MIXED, "wgmma") if arch == WGMMA_ARCH else ("mma",)):
            for bindings in (True, False):
                served = served_name_expressions(arch if arch == WGMMA_ARCH else None, path,
                                                 load_tuned_plans(device, path), bindings)
                assert set(served) <= set(names), (device, path, set(served) - set(names))
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
    from fusedresnet.kernels.geometry import GEOMETRY
    from fusedresnet.kernels.tiles import STEM_POOL_WGMMA_KERNELS
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
    from fusedresnet.kernels.dev import DEV_SOURCES, dev_name_expressions
    from fusedresnet.kernels.dev.conv_wgmma_ws import SOURCE, TILES
    from fusedresnet.kernels.geometry import GEOMETRY
    from fusedresnet.kernels.tiles import tile_by_label, tile_family
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
def test_dev_kernels_compile_for_sm_90a_without_warnings_or_spills(compiles):
    """Every experiment of kernels/dev/ builds with the served sources as its runner builds it
    (build.source_text with dev_sources), warnings as errors, its registers within one block per SM. Only the
    dev kernels are instantiated: the served ones compile in the test above."""
    from fusedresnet.kernels.dev import dev_name_expressions
    names = [name for names in dev_name_expressions().values() for name in names]
    report = compiles.result("nvcc-dev", WGMMA_ARCH)   # _nvcc_dev
    blocks = [b for b in report.split("Function properties for ")[1:] if b.startswith("_Z13conv_wgmma_ws")]
    assert len(blocks) == len(names), report
    for block in blocks:
        assert " 0 bytes spill stores" in block, block
        assert blocks_by_registers(int(re.search(r"Used (\d+) registers", block).group(1)), 384) >= 1, block
    assert "Potential Performance Loss" not in report, report


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
