"""The tile catalogue (kernels/tiles.py) and the geometry (kernels/geometry.py): every instantiation's named
schedule, epilogue and input, the labels derived from those names, shared memory and occupancy
(CPU only, no GPU)."""

from __future__ import annotations

import json
import re

import pytest

from fusedresnet.kernels.build import KERNEL_DIR, WGMMA_ARCH, name_expressions, source_text
from fusedresnet.kernels.tiles import (
    WGMMA_CLUSTER_TILES,
    WGMMA_TILES,
    Epilogue,
    Schedule,
    WgmmaConfig,
    shortcut_applies,
    shortcut_name_expression,
)


def test_cluster_splitk_tiles_are_the_plain_tiles_again_and_their_staged_tile_fits_the_ring():
    """conv_wgmma's CLUSTER_SPLITK instantiations ("wc" labels, v3): one per plain conv_wgmma tile, same
    shape, shared memory and blocks per SM; sm_90a only; never an untuned choice; the fp32 tile each slice
    stages (cluster_stage_bytes, [BM][BN + pad] floats) fits the ring it overwrites; rows padded so that
    the four fragment rows of one half-warp's float2 stores fall in distinct banks."""
    from fusedresnet.kernels.geometry import GEOMETRY, smem_bytes
    from fusedresnet.kernels.planner import conv_tiles
    from fusedresnet.kernels.tiles import CLUSTER_SPLITK_MAX, tile_by_label
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
    from fusedresnet.kernels.planner import ConvPlan, conv_tiles, make_plan
    from fusedresnet.kernels.tiles import WGMMA_PERSISTENT_TILES, runs_persistent, tile_by_label
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
    from fusedresnet.kernels.geometry import GEOMETRY, smem_bytes
    from fusedresnet.kernels.planner import conv_tiles, make_plan
    from fusedresnet.kernels.tiles import (
        WGMMA_TMA_TILES,
        loads_by_tma,
        runs_persistent,
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
    """Each wgmma tile names its schedule (tiles.Schedule) and its epilogue (tiles.Epilogue); its label is
    the schedule's prefix, the shape and the epilogue's suffix, the labels of kernels/tuned_plans.json."""
    from fusedresnet.kernels.tiles import SCHEDULE_EPILOGUES, WGMMA_CONV_TILES, tile_by_label
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
    on every target from the tiles enums, whose names the .cu files and the name expressions spell."""
    from fusedresnet.kernels.build import ARCHS, geometry_preamble
    from fusedresnet.kernels.tiles import (
        CONV_TILES,
        STEM_KERNELS,
        STEM_POOL_KERNELS,
        STEM_POOL_WGMMA_KERNELS,
        STEM_TILES,
        ConvInput,
        StemInput,
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
    """The tiles' blocks_per_sm (the cost model's occupancy) fits an SM's shared memory for every wgmma tile,
    and conv_wgmma's launch bounds (wgmma_min_blocks: two wherever two rings fit) ask ptxas for the
    registers of min(blocks_per_sm, 2) blocks; the registers themselves: the nvcc test above."""
    from fusedresnet.kernels.geometry import GEOMETRY
    from fusedresnet.kernels.tiles import WGMMA_TMA_TILES
    sm, reserved = GEOMETRY["SM_SMEM_BYTES"], GEOMETRY["SM_BLOCK_RESERVED_SMEM"]
    source = (KERNEL_DIR / "conv_wgmma.cu").read_text()
    # both launch bounds go through one rule (geometry.SMEM_BYTES "wgmma_launch_blocks", pasted as C++)
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
    from fusedresnet.kernels.tiles import PATCH_WGMMA_TILES, patch_wgmma_applies, tile_by_label, tile_family
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


def test_every_label_is_derived_from_the_named_schedule_and_reads_back_as_its_tile():
    """A tile's label (what kernels/tuned_plans/*.json record) is built from its kernel's names: the Schedule's
    prefix and the Epilogue's suffix for conv_wgmma*, the PatchEpilogue's suffix for conv3x3_patch_wgmma
    ("pwg128g2s4v1": 128 positions, 2 warpgroups, 4 stages, VEC16_STORES). Each label names one tile and one
    kernel, `tile_by_label` gives that tile back, and every label the committed tables name is one of them."""
    from fusedresnet.kernels.dev.conv_wgmma_ws import TILES as DEV_TILES
    from fusedresnet.kernels.planner import UNTUNED_PATCH_WGMMA, committed_tuned_plans
    from fusedresnet.kernels.tiles import (
        CONV_TILES,
        PATCH_TILES,
        PATCH_WGMMA_TILES,
        WGMMA_CONV_TILES,
        PatchEpilogue,
        PatchWgmmaConfig,
        tile_by_label,
    )
    catalogue = CONV_TILES + PATCH_TILES + WGMMA_CONV_TILES + PATCH_WGMMA_TILES
    assert len({t.label for t in catalogue}) == len(catalogue) == len({t.name_expression for t in catalogue})
    for tile in catalogue:
        assert tile_by_label(tile.label) is tile
    assert {e.name: e.value for e in PatchEpilogue} == {
        "FRAGMENTS": "", "VEC16_STORES": "v1", "VEC16_STORES_AND_LOADS": "v2"}
    for tile in PATCH_WGMMA_TILES:   # the kernel's VEC template argument: the epilogue's position
        assert tile.label == f"pwg{tile.bm}g{tile.warpgroups}s{tile.stages}{tile.epilogue.value}"
        assert tile.name_expression.endswith(f",{list(PatchEpilogue).index(tile.epilogue)}>")
    assert tile_by_label("pwg128g2s4v1") == PatchWgmmaConfig(128, 2, 4, PatchEpilogue.VEC16_STORES)
    assert tile_by_label("pwg128g2s4v1").name_expression == "conv3x3_patch_wgmma<128,2,4,1>"
    assert tile_by_label("pwg256g2s3v2").epilogue is PatchEpilogue.VEC16_STORES_AND_LOADS
    assert [t.label for t in UNTUNED_PATCH_WGMMA] == ["pwg128g2s4v1", "pwg64g1s4"]
    assert tile_by_label("wq128x128g2s4v") is None   # no such tile: ping-pong has no 16-byte epilogue
    planned, runners_up = set(), set()
    for entry in (e for path in committed_tuned_plans() for e in json.loads(path.read_text())["plans"].values()):
        planned |= {entry["tile"], *(e["tile"] for e in entry.get("by_family", {}).values())}
        runners_up |= {r.split("/")[0] for r in entry.get("runner_up", [])}
    assert len(planned) > 10
    assert all(tile_by_label(label) is not None and tile_by_label(label).label == label for label in planned)
    # the runners-up name served tiles, or an experiment of kernels/dev/ (timed once, never chosen)
    dev = {t.label for t in DEV_TILES}
    assert all(label in dev or tile_by_label(label).label == label for label in runners_up)


def test_shared_memory_formulas_are_integer_expressions_evaluated_without_eval():
    """geometry.SMEM_BYTES holds one text per formula, pasted as C++ and evaluated here by a small evaluator
    of integer expressions (no `eval`): the values follow the formulas, and anything but names, integers and
    + - * << >> & ~ <= is refused."""
    from fusedresnet.kernels.geometry import (
        GEOMETRY,
        STEM_FILTER_ROWS,
        STEM_KG_PADDED,
        STEM_ROW_VALUES,
        integer_expression,
        smem_bytes,
    )
    assert smem_bytes("conv", BM=128, BN=128, STAGES=3) == 3 * (128 + 128) * 64 * 2 == 98304
    assert smem_bytes("wgmma", BM=128, BN=256, STAGES=4) == 4 * 384 * 128 + 1024
    assert smem_bytes("patch_wgmma_rows", BM=128, W=56) == 248   # 128 + 2 * 56 + 13 = 253, rounded down to 8s
    # 1 + (a comparison): two blocks wherever two fit in 228 KB with 1 KB reserved each, else one
    assert smem_bytes("wgmma_launch_blocks", SMEM=114 * 1024 - 1024) == 2
    assert smem_bytes("wgmma_launch_blocks", SMEM=114 * 1024 - 1023) == 1
    assert integer_expression("((X + 7) & ~7) >> 1 << 2", {"X": 9}) == 32
    with pytest.raises(TypeError, match="got"):
        smem_bytes("conv", BM=128, BN=128)
    for text in ("__import__('os')", "X.real", "X // 2", "[X]", "X if X else 1", "Y + 1"):
        with pytest.raises(ValueError, match="not an integer expression"):
            integer_expression(text, {"X": 1})
    # the stem filter's layout, [K][8 rows][24 values]: 7 taps x 3 channels per row, whole k-tiles
    assert (STEM_FILTER_ROWS, STEM_ROW_VALUES) == (8, 24)
    assert STEM_FILTER_ROWS * STEM_ROW_VALUES == STEM_KG_PADDED == GEOMETRY["STEM_KG"]
    assert STEM_FILTER_ROWS >= 7 and STEM_ROW_VALUES >= 7 * 3 and STEM_KG_PADDED % GEOMETRY["BK"] == 0
