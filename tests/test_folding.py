"""BatchNorm folding and the folded parameter file, against the unfolded network."""

import torch
import torch.nn.functional as F

from fusedresnet.backend.engines.serving import TorchFoldedEngine
from fusedresnet.backend.images import normalize_uint8, smooth_random_images
from fusedresnet.backend.resnet.folding import all_convs, conv_and_batchnorm, fold_batchnorm, fold_resnet18
from fusedresnet.backend.resnet.weights import build_resnet18
from fusedresnet.client.agreement import compare_logits

TORCHVISION_KEYS_SAMPLE = [
    "conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked",
    "layer1.0.conv1.weight", "layer1.1.bn2.running_var", "layer2.0.downsample.0.weight",
    "layer2.0.downsample.1.running_mean", "layer4.1.conv2.weight", "fc.weight", "fc.bias",
]


def test_state_dict_has_torchvision_keys_and_round_trips(tmp_path):
    model = build_resnet18()
    state = model.state_dict()
    assert all(key in state for key in TORCHVISION_KEYS_SAMPLE)
    assert len(state) == 122  # torchvision resnet18: 62 params + 60 BatchNorm buffers
    path = tmp_path / "resnet18.pth"
    torch.save(state, path)
    reloaded = build_resnet18(str(path))
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(model(x), reloaded(x))


def test_seeded_weights_are_deterministic_and_batchnorm_is_not_identity():
    a, b = build_resnet18(seed=3), build_resnet18(seed=3)
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    assert not torch.allclose(a.bn1.running_var, torch.ones(64))
    assert not torch.allclose(a.bn1.running_mean, torch.zeros(64))


def test_seeded_weights_predict_different_classes_for_different_images():
    with torch.no_grad():
        logits = build_resnet18()(normalize_uint8(smooth_random_images(32, seed=5)))
    assert len(set(logits.argmax(1).tolist())) >= 10


def test_fold_batchnorm_matches_conv_then_batchnorm_for_every_layer():
    model = build_resnet18()
    params = fold_resnet18(model)
    for spec in all_convs():
        conv, bn = conv_and_batchnorm(model, spec.name)
        x = torch.randn(2, spec.in_channels, 20, 20, dtype=torch.float64)
        expected = F.batch_norm(F.conv2d(x, conv.weight.double(), stride=spec.stride, padding=spec.padding),
                                bn.running_mean.double(), bn.running_var.double(), bn.weight.double(),
                                bn.bias.double(), eps=bn.eps)
        weight, bias = fold_batchnorm(conv, bn)
        folded = F.conv2d(x, weight, bias, stride=spec.stride, padding=spec.padding)
        torch.testing.assert_close(folded, expected, rtol=1e-10, atol=1e-10)
        stored = params["convs"][spec.name]
        assert stored["weight"].dtype == torch.float16 and stored["bias"].dtype == torch.float32
        assert stored["weight"].shape == (spec.out_channels, spec.kernel, spec.kernel, spec.in_channels)
        torch.testing.assert_close(stored["weight"].double().permute(0, 3, 1, 2), weight, rtol=1e-3, atol=1e-4)


def test_folded_engine_matches_unfolded_network():
    model = build_resnet18()
    engine = TorchFoldedEngine(fold_resnet18(model))
    images = smooth_random_images(16, seed=9)
    with torch.no_grad():
        reference = model(normalize_uint8(images)).double().numpy()
    stats = compare_logits(engine.classify_uint8(images).numpy(), reference)
    assert stats["rel_l2"] < 5e-3, stats  # fp16 weights, fp32 compute
    assert stats["clear_disagreements"] == 0, stats


def test_engine_convs_fuse_each_downsample_into_its_blocks_conv2():
    """The fused engine's convolutions: conv1 and conv2 per block, the three downsampling blocks' conv2 carrying
    the block's projection (and no residual add), no downsample of its own."""
    from fusedresnet.backend.resnet.folding import engine_convs, resnet18_blocks
    convs = [c for block in resnet18_blocks() for c in engine_convs(block)]
    assert len(convs) == 16 and not any(c.name.endswith(".downsample") for c in convs)
    fused = [c for c in convs if c.shortcut is not None]
    assert [c.name for c in fused] == [f"layer{s}.0.conv2+downsample" for s in (2, 3, 4)]
    for c in fused:
        assert (c.kernel, c.stride, c.relu, c.adds_residual) == (3, 1, True, False)
        assert (c.shortcut.kernel, c.shortcut.stride, c.shortcut.in_channels) == (1, 2, c.in_channels // 2)
        assert c.shortcut_channels == c.in_channels // 2
        assert c.filter_name == c.name.removesuffix("+downsample")
    assert all(c.adds_residual for c in convs if c.name.endswith("conv2") and c.shortcut is None)
    # unfused (the small batch buckets): the downsample first, then conv1 and conv2 adding its output
    unfused = [c for block in resnet18_blocks() for c in engine_convs(block, fuse_shortcut=False)]
    assert len(unfused) == 19 and all(c.shortcut is None and c.shortcut_channels == 0 for c in unfused)
    assert [c.name for c in unfused[4:7]] == ["layer2.0.downsample", "layer2.0.conv1", "layer2.0.conv2"]


def test_shortcut_params_as_one_reduction_equal_conv2_plus_the_downsample():
    """The kernels' fused shortcut (kernels/loaders.cuh) as a float64 GEMM: the reduction is conv2's 3x3 taps
    (KRSC order, im2col of the block's conv1 output t) followed by the channels of the block's input x at
    (2p, 2q); the weights and bias come from `shortcut_params`. It must equal conv2(t) + downsample(x) as
    torch computes them from the folded filters, for an odd input size too (the last row at 2p = Hs - 1)."""
    from fusedresnet.backend.resnet.folding import engine_convs, resnet18_blocks, shortcut_params
    params = fold_resnet18(build_resnet18(seed=5))
    gen = torch.Generator().manual_seed(11)
    for block in resnet18_blocks():
        spec = engine_convs(block)[1]
        if spec.shortcut is None:
            continue
        weight, bias = shortcut_params(params["convs"], spec)
        c, cs, k = spec.in_channels, spec.shortcut.in_channels, spec.out_channels
        assert weight.shape == (k, 9 * c + cs) and weight.dtype == torch.float16 and bias.dtype == torch.float32
        for hs, ws in ((6, 8), (7, 5)):
            h, w = (hs + 1) // 2, (ws + 1) // 2
            t = torch.randn(2, h, w, c, generator=gen, dtype=torch.float64)
            x = torch.randn(2, hs, ws, cs, generator=gen, dtype=torch.float64)
            taps = F.pad(t, (0, 0, 1, 1, 1, 1))   # NHWC, one pixel of zeros around
            im2col = torch.cat([taps[:, r:r + h, s:s + w, :] for r in range(3) for s in range(3)]
                               + [x[:, ::2, ::2, :]], dim=3)
            fused = im2col @ weight.double().T + bias.double()
            conv2, down = params["convs"][spec.filter_name], params["convs"][spec.shortcut.name]
            ref = (F.conv2d(t.permute(0, 3, 1, 2), conv2["weight"].double().permute(0, 3, 1, 2),
                            conv2["bias"].double(), padding=1)
                   + F.conv2d(x.permute(0, 3, 1, 2), down["weight"].double().permute(0, 3, 1, 2),
                              down["bias"].double(), stride=2)).permute(0, 2, 3, 1)
            assert torch.allclose(fused, ref, rtol=1e-6, atol=1e-5), (spec.name, hs, ws)
