"""Correctness of every kernel and of the whole network, against float32 PyTorch.

    python -m fusedresnet.harness.check [--json PATH] [--quick] [--conv-path mma|wgmma|auto]

Run on a GPU host. Each check draws fresh random inputs, poisons the output
buffer (all-NaN fp16 / fp32) before the kernel runs, and compares with a
float32 PyTorch reference computed on the same fp16-rounded operands, TF32
off. Checks, in order:

1. every convolution shape of ResNet-18 (the stem from uint8 and from fp32
   input, every 3x3 and 1x1 conv with its real folded weights, the residual
   add where the network has one) at batch 1, 7, 32, 128, with the tile shape
   and split-K that the engine's planner picks (the tuned table's plan, and
   then also the untuned default plan where they differ); at batch 7 also
   every compiled tile shape of both families with split-K 1 and 4 forced;
2. the max-pool and the avgpool+fc head;
3. the whole engine (uint8 path, CUDA graphs, batch buckets with padding)
   against the unfolded float32 ResNet-18 on >= 500 varied inputs (a fixed
   seeded set; --network-seed for another): seeded smooth images, uniform
   noise, the sample photos and their mirror images:
   relative L2 error of the logits, top-1 agreement, near-tie disagreements;
   plus the fp32 NCHW input path and 64x64 inputs through `features`.

The convolutions run on the path the engine takes on this GPU (mixed on
compute capability 9.0: each plan names its family; mma.sync elsewhere;
--conv-path or FUSEDRESNET_CONV_PATH=mma|wgmma forces one family, --conv-path
auto takes this GPU's own path whatever the variable says; FUSEDRESNET_PDL as for the server): the first
check says which, every engine plan must be of a family the path allows
(forced wgmma: wgmma tiles only; mma: no wgmma tile), and where the sm_90a
module is loaded the forced-tile checks cover the wgmma tiles as well as the
mma.sync ones.

Prints one line per check and a summary; exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import cupy as cp
import torch
import torch.nn.functional as F

from ..backend.engines.config import CONV_PATH_ENV, conv_path_override, pdl_override
from ..backend.engines.fused_cuda import FusedCudaEngine
from ..backend.images import normalize_uint8, smooth_random_images
from ..backend.resnet.architecture import DEFAULT_SEED
from ..backend.resnet.folding import STEM, engine_convs, fold_resnet18, resnet18_blocks, shortcut_params
from ..backend.resnet.weights import build_resnet18
from ..client.agreement import compare_logits
from ..kernels.build import WGMMA_ARCH
from ..kernels.geometry import BK
from ..kernels.launch import conv_out_size, library
from ..kernels.launch_choices import MIXED, SHORTCUT_FUSION_MIN_BATCH, path_arch
from ..kernels.planner import ConvPlan, make_plan, plan_key, untuned_plan
from ..kernels.tiles import (
    CLUSTER_SPLITK_MAX,
    CONV_TILES,
    PATCH_TILES,
    PATCH_WGMMA_TILES,
    WGMMA_CONV_TILES,
    patch_applies,
    patch_wgmma_applies,
    reduces_in_cluster,
    runs_persistent,
    shortcut_applies,
    tile_family,
)

CONV_TOL = 5e-3        # relative L2, fp16 operands and output, fp32 accumulation
HEAD_TOL = 1e-3
NETWORK_TOL = 1e-2
BATCHES = (1, 7, 32, 128)


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


def to_torch(a) -> torch.Tensor:
    return torch.from_dlpack(a)


def poisoned(shape, dtype):
    a = cp.empty(shape, dtype=dtype)
    a.fill(cp.nan)
    return a


def layer_shapes(h: int = 224, w: int = 224, *, batch: int):
    """(spec, input H, W, the shortcut input's (H, W) or None) of every convolution the fused engine launches
    after the stem at this batch, in execution order (`folding.engine_convs`: from SHORTCUT_FUSION_MIN_BATCH
    up a downsampling block's conv2 carries the block's projection, whose input is the block's; below it the
    downsample is its own convolution of the block's input)."""
    from ..backend.engines.fused_cuda import stage_sizes
    shapes, x_hw = [], stage_sizes(h, w)[1]
    for block in resnet18_blocks():
        *_, conv2 = convs = engine_convs(block, batch >= SHORTCUT_FUSION_MIN_BATCH)
        out_hw = tuple(conv_out_size(v, 3, block.conv1.stride, 1) for v in x_hw)
        shapes += [(conv, *x_hw, None) for conv in convs[:-1]]   # [downsample,] conv1
        shapes.append((conv2, *out_hw, x_hw if conv2.shortcut is not None else None))
        x_hw = out_hw
    return shapes


class Checker:
    def __init__(self, quick: bool = False, network_seed: int = DEFAULT_SEED, conv_path: str | None = None,
                 pdl: bool | None = None):
        """`conv_path`, `pdl`: the kernel library's (None: auto, where the device has it)."""
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        self.quick = quick
        self.network_seed = network_seed
        self.requested_path = conv_path
        self.lib = library(0, conv_path, pdl)
        self.lib.load_candidates()   # every kernel the tuner may choose, served or not, compiled in parallel
        self.model = build_resnet18(None, DEFAULT_SEED)
        self.params = fold_resnet18(self.model, "seeded")
        self.engine = FusedCudaEngine(self.params, "cuda:0", conv_path=self.lib.path, pdl=pdl)
        self.results = []
        self.failures = 0
        self.gen = torch.Generator(device="cuda").manual_seed(int(time.time()))

    def record(self, name, ok, **metrics):
        self.results.append({"check": name, "ok": bool(ok), **metrics})
        if not ok:
            self.failures += 1
        text = " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())
        print(f"{'ok  ' if ok else 'FAIL'} {name} {text}", flush=True)

    def randn(self, *shape, scale=1.0):
        return torch.randn(*shape, device="cuda", generator=self.gen) * scale

    # -- convolutions --------------------------------------------------------
    def conv_case(self, spec, n, h, w, plan: ConvPlan | None = None, label: str = "", shortcut_hw=None):
        """One convolution of the network on fresh random input (`shortcut_hw`: the (H, W) of a fused
        shortcut's input, for a spec with one) against F.conv2d in fp32 of the folded filters."""
        folded = self.params["convs"][spec.filter_name]
        weight = folded["weight"].cuda()        # fp16 KRSC
        bias = folded["bias"].cuda().float()
        x = self.randn(n, h, w, spec.in_channels).relu().half()          # post-ReLU activations
        p = conv_out_size(h, spec.kernel, spec.stride, spec.padding)
        q = conv_out_size(w, spec.kernel, spec.stride, spec.padding)
        residual = self.randn(n, p, q, spec.out_channels).half() if spec.adds_residual else None
        shortcut_c = spec.shortcut_channels
        y = poisoned((n, p, q, spec.out_channels), cp.float16)
        if plan is None:
            plan = self.lib.plan(n, h, w, spec.in_channels, spec.out_channels, spec.kernel, spec.kernel, spec.stride,
                                 spec.padding, shortcut_c=shortcut_c)
        # A forced path runs its own family only (tuned or not); mixed runs either.
        path_ok = self.lib.path == MIXED or tile_family(plan.tile) == self.lib.path
        workspace = (cp.empty(plan.splits * n * p * q * spec.out_channels + 1, dtype=cp.float32)
                     if plan.splits > 1 else None)
        if spec.shortcut is not None:   # the engine's weights: the two filters concatenated, the biases summed
            xs = self.randn(n, *shortcut_hw, shortcut_c).relu().half()
            fused_weight, fused_bias = (t.cuda() for t in shortcut_params(self.params["convs"], spec))
            self.lib.conv_shortcut(cp.from_dlpack(x), cp.from_dlpack(fused_weight), cp.from_dlpack(fused_bias), y,
                                   cp.from_dlpack(xs), shortcut_stride=spec.shortcut.stride, relu=spec.relu,
                                   plan=plan, workspace=workspace)
        else:
            self.lib.conv(cp.from_dlpack(x), cp.from_dlpack(weight), cp.from_dlpack(bias), y, stride=spec.stride,
                          pad=spec.padding, relu=spec.relu,
                          residual=None if residual is None else cp.from_dlpack(residual), plan=plan,
                          workspace=workspace)
        cp.cuda.Device().synchronize()
        ref = F.conv2d(x.float().permute(0, 3, 1, 2), weight.float().permute(0, 3, 1, 2), bias,
                       stride=spec.stride, padding=spec.padding).permute(0, 2, 3, 1)
        if spec.shortcut is not None:   # the projection as torch runs the block's downsample
            projection = self.params["convs"][spec.shortcut.name]
            projection_weight = projection["weight"].cuda().float().permute(0, 3, 1, 2)
            ref = ref + F.conv2d(xs.float().permute(0, 3, 1, 2), projection_weight, projection["bias"].cuda().float(),
                                 stride=spec.shortcut.stride).permute(0, 2, 3, 1)
            label += f" shortcut {shortcut_hw[0]}x{shortcut_hw[1]}"
        if residual is not None:
            ref = ref + residual.float()
        if spec.relu:
            ref = ref.relu()
        out = to_torch(y).float()
        unwritten = int(torch.isnan(out).sum())
        err = rel_l2(out, ref) if not unwritten else float("nan")
        self.record(f"conv {spec.name} N={n} {h}x{w} tile={plan.tile.label} splitk={plan.splits}{label}",
                    unwritten == 0 and err <= CONV_TOL and path_ok, rel_l2=err, unwritten=unwritten,
                    max_abs=float((out - ref).abs().max()), **({} if path_ok else {"off_path": self.lib.path}))

    def untuned(self, spec, n, h, w) -> ConvPlan:
        """The plan of a convolution of the network without the tuned table (another GPU model or size)."""
        return untuned_plan(n, h, w, spec.in_channels, spec.out_channels, spec.kernel, spec.stride, spec.padding,
                            self.lib.sms, self.lib.path, spec.shortcut_channels)

    def stem_inputs(self, n, h, w):
        """Random uint8 images, their normalised float32 NCHW form and the float32 stem (conv + ReLU) of them."""
        weight = self.params["convs"][STEM.name]["weight"].cuda()
        bias = self.params["convs"][STEM.name]["bias"].cuda().float()
        images = torch.randint(0, 256, (n, h, w, 3), device="cuda", dtype=torch.uint8, generator=self.gen)
        normalized = normalize_uint8(images)
        stem = F.conv2d(normalized, weight.float().permute(0, 3, 1, 2), bias, stride=2, padding=3).relu()
        return images, normalized, stem

    def stem_case(self, n, h, w, kind, method="patch"):
        engine = self.engine
        images, normalized, reference_stem = self.stem_inputs(n, h, w)
        p, q = conv_out_size(h, 7, 2, 3), conv_out_size(w, 7, 2, 3)
        y = poisoned((n, p, q, 64), cp.float16)
        if kind == "uint8":
            self.lib.stem(cp.from_dlpack(images), engine.stem_weight, engine.stem_bias, y, kind="uint8",
                          in_scale=engine.in_scale, in_shift=engine.in_shift, method=method)
        else:
            self.lib.stem(cp.from_dlpack(normalized.contiguous()), engine.stem_weight, engine.stem_bias, y,
                          kind="float32", method=method)
        cp.cuda.Device().synchronize()
        ref = reference_stem.permute(0, 2, 3, 1)
        out = to_torch(y).float()
        unwritten = int(torch.isnan(out).sum())
        err = rel_l2(out, ref) if not unwritten else float("nan")
        self.record(f"stem[{kind},{method}] N={n} {h}x{w}", unwritten == 0 and err <= CONV_TOL, rel_l2=err,
                    unwritten=unwritten, max_abs=float((out - ref).abs().max()))

    def stem_pool_case(self, n, h, w, kind, byte_offset=0):
        """byte_offset > 0: the uint8 images start that many bytes into their allocation (a view), so
        that the wgmma stem's 16-byte raw-patch copies straddle the input's first and last bytes."""
        engine = self.engine
        images, normalized, reference_stem = self.stem_inputs(n, h, w)
        p1, q1 = conv_out_size(h, 7, 2, 3), conv_out_size(w, 7, 2, 3)
        p2, q2 = conv_out_size(p1, 3, 2, 1), conv_out_size(q1, 3, 2, 1)
        y = poisoned((n, p2, q2, 64), cp.float16)
        if kind == "uint8":
            source = cp.from_dlpack(images)
            if byte_offset:
                buffer = cp.full(images.numel() + byte_offset + 16, 255, dtype=cp.uint8)
                source = buffer[byte_offset:byte_offset + images.numel()].reshape(images.shape)
                source[...] = cp.from_dlpack(images)
        else:
            source = cp.from_dlpack(normalized.contiguous())
        self.lib.stem_pool(source, engine.stem_weight, engine.stem_bias, y, kind=kind,
                           in_scale=engine.in_scale, in_shift=engine.in_shift)
        cp.cuda.Device().synchronize()
        ref = F.max_pool2d(reference_stem, 3, 2, 1).permute(0, 2, 3, 1)
        out = to_torch(y).float()
        unwritten = int(torch.isnan(out).sum())
        err = rel_l2(out, ref) if not unwritten else float("nan")
        offset = f" at byte offset {byte_offset}" if byte_offset else ""
        self.record(f"stem+maxpool[{kind}] N={n} {h}x{w}{offset}", unwritten == 0 and err <= CONV_TOL, rel_l2=err,
                    unwritten=unwritten, max_abs=float((out - ref).abs().max()))

    def pool_head_cases(self, n):
        x = self.randn(n, 112, 112, 64).relu().half()
        y = poisoned((n, 56, 56, 64), cp.float16)
        self.lib.maxpool_3x3s2(cp.from_dlpack(x), y)
        cp.cuda.Device().synchronize()
        ref = F.max_pool2d(x.float().permute(0, 3, 1, 2), 3, 2, 1).permute(0, 2, 3, 1)
        out = to_torch(y).float()
        self.record(f"maxpool N={n}", bool(torch.equal(out, ref)), max_abs=float((out - ref).abs().max()))
        fc_w = self.params["fc"]["weight"].cuda()
        fc_b = self.params["fc"]["bias"].cuda().float()
        for hw in (7, 2, 1):
            feats = self.randn(n, hw, hw, 512).relu().half()
            logits = poisoned((n, 1000), cp.float32)
            self.lib.avgpool_fc(cp.from_dlpack(feats), cp.from_dlpack(fc_w), cp.from_dlpack(fc_b), logits)
            cp.cuda.Device().synchronize()
            ref = F.linear(feats.float().mean(dim=(1, 2)), fc_w.float(), fc_b)
            out = to_torch(logits)
            unwritten = int(torch.isnan(out).sum())
            err = rel_l2(out, ref) if not unwritten else float("nan")
            self.record(f"avgpool_fc N={n} {hw}x{hw}", unwritten == 0 and err <= HEAD_TOL, rel_l2=err,
                        unwritten=unwritten)

    def conv_path_case(self):
        """The convolutions run on wgmma on cc 9.0 unless mma was asked for, on mma.sync elsewhere."""
        asked = self.requested_path or "auto"
        hopper = self.lib.cc == (9, 0)
        expected = asked if asked in ("mma", "wgmma") else MIXED if hopper else "mma"
        self.record(f"conv path {self.lib.path} on {self.lib.device_name} (cc {self.lib.cc[0]}.{self.lib.cc[1]}, "
                    f"asked {asked})", self.lib.path == expected and self.engine.lib is self.lib,
                    expected=expected)

    def kernels(self):
        self.conv_path_case()
        batches = (1, 7) if self.quick else BATCHES
        for n in batches:
            for kind in ("uint8", "float32"):
                for method in ("patch", "gemm"):
                    self.stem_case(n, 224, 224, kind, method)
            for kind in ("uint8", "float32"):
                self.stem_pool_case(n, 224, 224, kind)
        for h, w in ((64, 80), (33, 47), (97, 130), (32, 32)):
            self.stem_pool_case(2, h, w, "uint8")
        self.stem_pool_case(2, 97, 130, "uint8", byte_offset=5)
        self.stem_pool_case(3, 224, 224, "uint8", byte_offset=1)
        self.stem_case(3, 64, 80, "uint8")
        self.stem_case(2, 33, 47, "float32")
        self.stem_case(2, 97, 130, "uint8")
        for n in batches:
            for spec, h, w, shortcut_hw in layer_shapes(batch=n):
                self.conv_case(spec, n, h, w, shortcut_hw=shortcut_hw)
                shortcut_c = spec.shortcut_channels
                key = plan_key(n, h, w, spec.in_channels, spec.out_channels, spec.kernel, spec.stride, shortcut_c)
                if key in self.lib.tuned:   # the plan without the table (another GPU model, another size)
                    default = self.untuned(spec, n, h, w)
                    if (default.tile, default.splits) != self.lib.tuned[key]:
                        self.conv_case(spec, n, h, w, default, " (untuned default)", shortcut_hw)
        # every convolution of either arrangement (the downsample alone, conv2 with it fused in)
        for spec, h, w, shortcut_hw in dict.fromkeys(layer_shapes(batch=1) + layer_shapes(batch=BATCHES[-1])):
            shortcut_c = spec.shortcut_channels
            k_tiles = (spec.kernel * spec.kernel * spec.in_channels + shortcut_c) // BK
            m = (7 * conv_out_size(h, spec.kernel, spec.stride, spec.padding)
                 * conv_out_size(w, spec.kernel, spec.stride, spec.padding))
            if spec.shortcut is not None:   # the implicit-GEMM tiles only (below), and two odd sizes
                plan = self.lib.plan(2, 17, 23, spec.in_channels, spec.out_channels, 3, 3, 1, 1, shortcut_c)
                for odd_hw in ((33, 45), (34, 46)):   # both give 17 x 23 positions at stride 2
                    self.conv_case(spec, 2, 17, 23, plan, " (odd size)", odd_hw)
            for tile in PATCH_TILES if spec.shortcut is None else ():
                if patch_applies(tile, spec.in_channels, spec.out_channels, spec.kernel, spec.stride, spec.padding):
                    p = conv_out_size(h, 3, 1, 1)
                    plan = make_plan(tile, 1, m, spec.out_channels, k_tiles, 7, p, p)
                    self.conv_case(spec, 7, h, w, plan, " (forced)")
                    forced = make_plan(tile, 1, 2 * 17 * 45, spec.out_channels, k_tiles, 2, 17, 45)
                    self.conv_case(spec, 2, 17, 45, forced, " (forced, odd size)")
            for tile in PATCH_WGMMA_TILES if path_arch(self.lib.path) == WGMMA_ARCH and spec.shortcut is None else ():
                if patch_wgmma_applies(tile, spec.in_channels, spec.out_channels, spec.kernel, spec.stride,
                                       spec.padding, w):
                    # 1-2 tiles per block at N=7, 6-7 at N=32 (the persistent loop's every path), odd size
                    for n_img in (7, 32):
                        plan = make_plan(tile, 1, n_img * h * w, spec.out_channels, k_tiles, n_img, h, w)
                        self.conv_case(spec, n_img, h, w, plan, " (forced)")
                    forced = make_plan(tile, 1, 2 * 17 * 45, spec.out_channels, k_tiles, 2, 17, 45)
                    self.conv_case(spec, 2, 17, 45, forced, " (forced, odd size)")
            wgmma_tiles = WGMMA_CONV_TILES if path_arch(self.lib.path) == WGMMA_ARCH else ()
            for tile in CONV_TILES + wgmma_tiles:
                if spec.shortcut is not None and not shortcut_applies(tile):
                    continue
                if runs_persistent(tile):   # "wp": 5 blocks (8-9 tiles each, the ring across them), then all
                    tiles = make_plan(tile, 1, m, spec.out_channels, k_tiles).grid[0]
                    for blocks in (min(5, tiles), tiles):
                        plan = ConvPlan(tile, 1, k_tiles, (blocks, 1, 1))
                        self.conv_case(spec, 7, h, w, plan, f" (forced, {blocks} blocks)", shortcut_hw)
                    continue
                # a "wc" tile's cluster of slices: 3 (k-tiles not a multiple at most shapes) and the most
                for splits in (3, CLUSTER_SPLITK_MAX) if reduces_in_cluster(tile) else (1, 4):
                    per = math.ceil(k_tiles / splits)
                    real = math.ceil(k_tiles / per)
                    grid = (math.ceil(m / tile.bm), math.ceil(spec.out_channels / tile.bn), real)
                    plan = ConvPlan(tile, real, per, grid)
                    self.conv_case(spec, 7, h, w, plan, " (forced)", shortcut_hw)
        for n in (1, 7, 33):
            self.pool_head_cases(n)

    # -- whole network -------------------------------------------------------
    def network(self):
        from ..client.preprocess import preprocess_files, sample_photo_paths
        engine = self.engine
        model = self.model.cuda().float().eval()
        # A fixed, seeded input set by default, so the agreement counts are
        # reproducible (with these untrained weights many inputs have top-1/top-2
        # margins below the fp16 error, and the count of flipped near-ties moves
        # with the draw); --network-seed draws another set.
        seed = self.network_seed
        photos = torch.from_numpy(preprocess_files(sample_photo_paths()))
        parts = [smooth_random_images(256, seed),
                 torch.randint(0, 256, (240, 224, 224, 3), dtype=torch.uint8,
                               generator=torch.Generator().manual_seed(seed)),
                 photos, photos.flip(2)]
        images = torch.cat(parts)
        logits, refs = [], []
        # Uneven batches: exercise every bucket with padding rows.
        sizes, start = [1, 7, 32, 128, 3, 64, 100, 5, 17], 0
        while start < len(images):
            size = sizes[len(logits) % len(sizes)]
            batch = images[start:start + size]
            logits.append(engine.classify_uint8(batch).float().cpu())
            with torch.inference_mode():
                refs.append(model(normalize_uint8(batch.cuda())).float().cpu())
            start += size
        stats = compare_logits(torch.cat(logits).numpy(), torch.cat(refs).numpy())
        ok = (stats["rel_l2"] <= NETWORK_TOL and stats["top1_agree"] >= 0.99 * stats["inputs"]
              and stats["clear_disagreements"] == 0)
        self.record("network uint8 224x224 vs float32 ResNet-18", ok, **stats)
        self.network_stats = stats

        batch = images[:37].cuda()
        with torch.inference_mode():
            normalized = normalize_uint8(batch)
            ref = model(normalized).float()
        out = engine.classify_normalized(normalized)
        err = rel_l2(out, ref)
        self.record("network fp32 NCHW input N=37", err <= NETWORK_TOL, rel_l2=err)

        small = torch.randint(0, 256, (9, 64, 64, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
        feats = engine.features(small)
        with torch.inference_mode():
            ref = self.model.features(normalize_uint8(small.cuda())).float()
        ok = tuple(feats.shape) == (9, 512, 2, 2) and rel_l2(feats, ref) <= NETWORK_TOL
        self.record("features uint8 64x64 N=9", ok, shape=str(tuple(feats.shape)), rel_l2=rel_l2(feats, ref))
        odd = torch.randint(0, 256, (5, 97, 130, 3), dtype=torch.uint8,
                            generator=torch.Generator().manual_seed(seed + 1))
        out = engine.classify_uint8(odd)
        with torch.inference_mode():
            ref = model(normalize_uint8(odd.cuda())).float()
        self.record("network uint8 97x130 N=5", rel_l2(out, ref) <= NETWORK_TOL, rel_l2=rel_l2(out, ref))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write all results here")
    parser.add_argument("--quick", action="store_true", help="batches 1 and 7 only for the per-layer checks")
    parser.add_argument("--network-seed", type=int, default=DEFAULT_SEED,
                        help="seed of the whole-network input set (default: the fixed reference set)")
    parser.add_argument("--conv-path", choices=("auto", "mma", "wgmma"),
                        default=conv_path_override(),
                        help=f"force a convolution path, or auto: this GPU's own (mixed on cc 9.0, else mma) "
                             f"whatever ${CONV_PATH_ENV} says (default: ${CONV_PATH_ENV}, else auto)")
    args = parser.parse_args(argv)
    checker = Checker(args.quick, args.network_seed, args.conv_path, pdl_override())
    started = time.time()
    try:
        checker.kernels()
        checker.network()
    finally:
        summary = {
            "device": torch.cuda.get_device_name(0),
            "conv_path": checker.lib.path,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "checks": len(checker.results),
            "failures": checker.failures,
            "network": getattr(checker, "network_stats", None),
            "network_seed": args.network_seed,
            "seconds": round(time.time() - started, 1),
            "results": checker.results,
        }
        if args.json:
            with open(args.json, "w") as f:
                json.dump(summary, f, indent=1)
        print(f"SUMMARY {summary['checks']} checks, {summary['failures']} failures, conv_path={checker.lib.path}, "
              f"network={summary['network']}")
    return 1 if checker.failures else 0


if __name__ == "__main__":
    sys.exit(main())
