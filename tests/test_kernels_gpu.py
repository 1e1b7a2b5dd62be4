"""The fused kernels and engine against float32 PyTorch, on a GPU (skipped elsewhere).

Each test draws fresh random inputs and poisons the outputs first (see
`fusedresnet.harness.check`, which also runs as a script with the full matrix
of layer shapes and batch sizes).
"""

from __future__ import annotations

import pytest

from fusedresnet.client.agreement import SET_REL_L2_TOLERANCE

cupy = pytest.importorskip("cupy", reason="CuPy not installed: the fused engine cannot run here")
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def checker():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from fusedresnet.harness.check import Checker
    return Checker(quick=True)


def failures(checker, start):
    return [r for r in checker.results[start:] if not r["ok"]]


def test_every_layer_kernel_matches_float32_pytorch_at_batch_1_and_7(checker):
    start = len(checker.results)
    checker.kernels()
    assert not failures(checker, start)
    assert len(checker.results) - start > 150


def test_whole_network_agrees_with_float32_resnet18_on_500_inputs(checker):
    start = len(checker.results)
    checker.network()
    assert not failures(checker, start)
    stats = checker.network_stats
    assert stats["inputs"] >= 500
    assert stats["rel_l2"] <= SET_REL_L2_TOLERANCE
    assert stats["top1_agree"] >= 0.99 * stats["inputs"]
    assert stats["clear_disagreements"] == 0


def test_engine_serves_through_create_custom_engine(checker, tmp_path):
    from fusedresnet.backend.engines.serving import create_custom_engine
    torch.save(checker.params, tmp_path / "folded.pt")
    engine, reason = create_custom_engine(tmp_path / "folded.pt", "cuda:0")
    assert engine.name.startswith("fused-cuda-fp16-"), reason   # not a fallback engine
    # the name says which kernel families its plans run on (docs/ENGINE.md, *Kernel families*): on the GPU
    # of the tuned table (the mixed path), the families the table names, beside the wgmma stem
    import json

    from fusedresnet.kernels.launch_choices import MIXED
    from fusedresnet.kernels.planner import tuned_plans_path
    table_path = tuned_plans_path(engine.lib.device_name)
    if engine.lib.path == "mma":
        assert engine.name == "fused-cuda-fp16-mma"
    elif engine.lib.path == MIXED and table_path.is_file():
        families = {entry["family"] for entry in json.loads(table_path.read_text())["plans"].values()} | {"wgmma"}
        assert engine.name == "fused-cuda-fp16-" + "+".join(f for f in ("wgmma", "mma") if f in families)
    else:
        assert engine.name.startswith("fused-cuda-fp16-wgmma")
    images = torch.randint(0, 256, (3, 224, 224, 3), dtype=torch.uint8)
    logits = engine.classify_uint8(images)
    assert logits.shape == (3, 1000) and logits.dtype == torch.float32 and torch.isfinite(logits).all()


def test_conv_path_is_mixed_on_compute_capability_9_and_each_family_can_be_forced(checker):
    from fusedresnet.kernels.launch import library
    from fusedresnet.kernels.launch_choices import MIXED
    from fusedresnet.kernels.tiles import PATCH_WGMMA_TILES, WGMMA_TILES, tile_family
    hopper = torch.cuda.get_device_capability(0) == (9, 0)
    forced = library(0, "mma")
    assert forced.path == "mma"
    if not hopper:
        assert checker.lib.path == "mma"
        with pytest.raises(RuntimeError, match="compute capability 9.0"):
            library(0, "wgmma")
        return
    # The forced mma.sync library has no wgmma kernels; the sm_90a one (wgmma, mixed) has both families.
    assert not any(t.name_expression in forced.smem for t in WGMMA_TILES)
    mixed, wgmma = library(0, "auto"), library(0, "wgmma")
    assert mixed.path == MIXED and wgmma.path == "wgmma"
    # serving loads only what its plans can launch; the candidates come when asked for
    assert set(mixed.served) <= set(mixed.kernels) and set(mixed.served) < set(mixed.smem)
    assert all(t.name_expression in mixed.smem for t in WGMMA_TILES)
    # Batch 3 is never in a tuning table: the untuned plans. Forced paths keep to their family;
    # mixed takes mma.sync at small batch (NOTES.md, outcome 7).
    for args in ((3, 28, 28, 128, 128, 3, 3, 1, 1), (3, 7, 7, 512, 512, 3, 3, 1, 1)):
        assert tile_family(wgmma.plan(*args).tile) == "wgmma"
        assert tile_family(forced.plan(*args).tile) == "mma"
        assert tile_family(mixed.plan(*args).tile) == "mma"
    assert tile_family(mixed.plan(96, 7, 7, 512, 512, 3, 3, 1, 1).tile) == "wgmma"   # batch 96: 84 M MAC/SM
    # layer1 (C = 64, 3x3/1) on the patch wgmma kernel at any batch, on both sm_90a paths (outcome 15)
    for lib in (mixed, wgmma):
        assert lib.plan(3, 56, 56, 64, 64, 3, 3, 1, 1).tile.label.startswith("pwg")
    assert not forced.plan(3, 56, 56, 64, 64, 3, 3, 1, 1).tile.label.startswith("pwg")
    assert all(t.name_expression in mixed.smem for t in PATCH_WGMMA_TILES)
    assert not any(t.name_expression in forced.smem for t in PATCH_WGMMA_TILES)


def test_a_plan_key_shared_by_conv1_and_conv2_is_ranked_on_both_epilogues(checker):
    """The tuner's ranking of a shape that a stage's conv1 and its residual-adding conv2 share: every
    candidate of either epilogue, once, fastest first by the mean of the two."""
    from fusedresnet.kernels.build import WGMMA_ARCH
    from fusedresnet.kernels.launch_choices import CONV_PATHS, path_arch
    from fusedresnet.kernels.tune import tune_conv, tune_shared_key
    lib = checker.lib
    families = CONV_PATHS if path_arch(lib.path) == WGMMA_ARCH else ("mma",)
    shape = (2, 28, 28, 128, 128, 3, 1, 1)   # layer2's stride-1 convolutions at batch 2
    alone, _ = tune_conv(lib, families, *shape, True, False, None)
    rows, model_ms = tune_shared_key(lib, families, *shape, {(True, False, None): 1, (True, True, None): 1})
    labels = [(plan.tile.label, plan.splits) for _, plan in rows]
    assert sorted(labels) == sorted((plan.tile.label, plan.splits) for _, plan in alone)
    assert len(set(labels)) == len(labels)
    times = [ms for ms, _ in rows]
    assert times == sorted(times) and times[0] > 0 and model_ms >= times[0]
