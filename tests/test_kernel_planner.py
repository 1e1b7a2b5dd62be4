"""The planner (kernels/planner.py) and the conv path (kernels/launch_choices.py): which tile and split-K each
convolution runs with on each path, from the tuned table or the untuned rules, and which kernels serving
compiles (CPU only, no GPU)."""

from __future__ import annotations

import re

import pytest

from fusedresnet.kernels.build import WGMMA_ARCH, name_expressions
from fusedresnet.kernels.tiles import (
    WGMMA_CLUSTER_TILES,
    WGMMA_TILES,
    shortcut_applies,
    shortcut_name_expression,
)


def test_untuned_plans_put_layer1_on_the_patch_wgmma_kernel_on_the_sm_90a_paths_only():
    """Measured on the H100 (NOTES.md outcomes 15 and 43, layer1 at batch 1-256): conv3x3_patch_wgmma beat
    every other tile and split-K; BM 64 at batch 1 (27 tiles of 128 for 132 SMs), from batch 8 on BM 128
    with the 16-byte epilogue stores (v1: the fastest at 128 and 256, within 5% of v2 at 8 and 32)."""
    from fusedresnet.kernels.launch_choices import MIXED
    from fusedresnet.kernels.planner import untuned_plan
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
    from fusedresnet.kernels.launch_choices import MIXED
    from fusedresnet.kernels.planner import plan_key, untuned_plan
    from fusedresnet.kernels.tiles import CONV_TILES, PATCH_TILES, PATCH_WGMMA_TILES, WGMMA_TILES
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
    """The kernel library takes the path as an argument and reads no environment; the environment's override
    is read by engines.config (test_engine_config.py)."""
    from fusedresnet.kernels.launch_choices import MIXED, conv_path
    monkeypatch.setenv("FUSEDRESNET_CONV_PATH", "mma")   # not read here
    assert conv_path((9, 0)) == MIXED == conv_path((9, 0), "auto") == conv_path((9, 0), None)
    assert [conv_path(cc) for cc in ((8, 0), (8, 6), (8, 9), (10, 0), (12, 0))] == ["mma"] * 5
    assert conv_path((9, 0), "mma") == "mma" and conv_path((9, 0), "wgmma") == "wgmma"
    with pytest.raises(RuntimeError, match="compute capability 9.0"):
        conv_path((8, 9), "wgmma")                         # never a silent fallback
    with pytest.raises(ValueError, match="auto, mma or wgmma"):
        conv_path((8, 9), MIXED)                           # mixed needs the sm_90a module too
    with pytest.raises(ValueError, match="auto, mma or wgmma"):
        conv_path((9, 0), "tensor")


def test_untuned_mixed_plans_use_mma_sync_at_small_batch_and_for_1x1_and_wgmma_for_large_3x3():
    """The untuned rule of NOTES.md outcome 7 on an H100 (132 SMs), at the issue's batch sizes."""
    from fusedresnet.kernels.launch_choices import MIXED
    from fusedresnet.kernels.planner import plan_default
    from fusedresnet.kernels.tiles import tile_family
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

    from fusedresnet.kernels.launch_choices import MIXED
    from fusedresnet.kernels.planner import load_tuned_plans
    from fusedresnet.kernels.tiles import WGMMA_TILES
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
    """One table per GPU model (kernels/tuned_plans/<model>.json), named for the device it records; a GPU reads its
    own table and no other."""
    import json

    from fusedresnet.kernels.launch_choices import CONV_PATHS, MIXED
    from fusedresnet.kernels.planner import committed_tuned_plans, load_tuned_plans, tuned_plans_path
    tables = committed_tuned_plans()
    assert {path.name for path in tables} >= {"NVIDIA_H100_80GB_HBM3.json", "NVIDIA_H200.json"}
    for table_path in tables:
        table = json.loads(table_path.read_text())
        device = table["device"]
        assert tuned_plans_path(device) == table_path
        families = table.get("families", [table.get("conv_path", "mma")])
        for family in CONV_PATHS:
            assert (len(load_tuned_plans(device, family)) == len(table["plans"])) == (family in families)
        assert bool(load_tuned_plans(device, MIXED)) == (set(families) == set(CONV_PATHS))
        assert load_tuned_plans("NVIDIA A100-SXM4-80GB", families[0]) == {}
        assert load_tuned_plans("NVIDIA A100-SXM4-80GB", families[0], table_path) == {}   # another GPU's table
    assert tuned_plans_path("NVIDIA H100 80GB HBM3").name == "NVIDIA_H100_80GB_HBM3.json"
    assert tuned_plans_path("NVIDIA A100-SXM4-80GB").name == "NVIDIA_A100_SXM4_80GB.json"


def test_a_cluster_splitk_plan_needs_no_workspace_and_falls_back_to_its_workspace_twin():
    """A "wc" plan reduces its slices in the cluster: no fp32 workspace; without cluster launches
    (`without_cuda_bindings`) it runs on the "wg" tile of the same shape, through the workspace."""
    from fusedresnet.kernels.planner import make_plan
    from fusedresnet.kernels.tiles import without_cuda_bindings
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
    """What the engine compiles at load on each path (planner.served_name_expressions): the kernel of every
    plan in each committed table (kernels/tuned_plans/<model>.json) on its GPU, of every untuned plan (other batch
    sizes, input sizes and GPUs), the stem + max-pool of its module and the head; not the tuner's other candidates
    (the warp-specialised conv_wgmma_ws, which it never chose), which a library compiles only when asked."""
    import json

    from fusedresnet.kernels.planner import committed_tuned_plans
    for table_path in committed_tuned_plans():
        served_on_its_gpu(json.loads(table_path.read_text()))


def kernel(tile, shortcut_c):
    return shortcut_name_expression(tile) if shortcut_c else tile.name_expression


def served_on_its_gpu(table: dict) -> None:
    from fusedresnet.kernels.launch_choices import MIXED, path_arch
    from fusedresnet.kernels.planner import load_tuned_plans, served_name_expressions, untuned_plan
    from fusedresnet.kernels.tiles import STEM_POOL_KERNELS, tile_by_label
    device = table["device"]
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
    # On the table's GPU (90 plans, all wgmma on the H100 and the H200) the sm_90a module shrinks to less than half
    # of the candidates
    mixed = served_name_expressions(WGMMA_ARCH, MIXED, load_tuned_plans(device, MIXED), True)
    assert len(mixed) < len(name_expressions(WGMMA_ARCH)) / 2
    # Without cuda.bindings the tuned "wc", "wt" and "wq" tiles are served by their twins: none of theirs compiled
    twins = served_name_expressions(WGMMA_ARCH, MIXED, load_tuned_plans(device, MIXED), False)
    assert not any(n.startswith("conv_wgmma_tma<") or "CLUSTER_SPLIT_K" in n
                   for n in twins)
    # another GPU: only what the untuned plans can choose
    other = served_name_expressions(WGMMA_ARCH, MIXED, load_tuned_plans("NVIDIA H20", MIXED), True)
    assert set(other) < set(mixed) and not any(n.startswith("conv_wgmma_tma<") for n in other)
