"""Thin CuPy launchers for the kernels in this folder.

`KernelLibrary(device_id)` compiles, once per device, the kernels that serving
can launch (`planner.served_name_expressions`: those of this GPU's tuned plans
and of the untuned plans), and launches them on the current CuPy stream (the
engine enters its own with `with stream:`); the tuner's other candidates are
compiled only when a plan names one (the checks and the tuner compile them all
first: `load_candidates`). Kernels are compiled by `nvrtc_build` (one NVRTC
program per kernel, in parallel, cached on disk) for the device's architecture
(build.ARCHS; on a newer GPU the mma.sync kernels go through CuPy's
RawModule). On cc 9.0 (the mixed path, and the wgmma path when a caller forces
it) the kernels of both families are compiled for
sm_90a, and each convolution runs on the family its plan's tile belongs to
(`launch_choices.conv_path`, `planner.untuned_plan`, the tuned table).
Shapes are checked here, with messages that say which rule a tensor broke,
because the kernels themselves assume aligned, well-formed input.

On compute capability >= 9.0 launches are programmatic dependent launches
(cuLaunchKernelEx from cuda.bindings with the programmatic-stream-serialization
attribute; common.cuh `pdl_begin` is the kernels' half) unless `launch_mode`
says otherwise (the engine: batch buckets above launch_choices.PDL_MAX_BATCH launch
plainly): the next kernel's blocks are scheduled while this one's last blocks
run and wait on the GPU for it to finish. The same holds inside a captured
CUDA graph (programmatic edges). `pdl=False` turns it off; without
cuda.bindings, or before 9.0, launches are CuPy's plain ones. The "wc" tiles
(conv_wgmma's split-K reduced in a cluster of its slices) always launch through
cuLaunchKernelEx, with the cluster-dimension attribute.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading

import cupy as cp
import numpy as np

from .build import (
    ARCHS,
    COMPILE_OPTIONS,
    WGMMA_ARCH,
    kernel_smem,
    name_expressions,
    nvrtc_options,
    source_text,
)
from .geometry import (
    BK,
    EW_THREADS,
    HEAD_BLOCKS_X,
    HEAD_IMGS,
    HEAD_THREADS,
    STEM_KG_PADDED,
    STEM_POOL_SMEM_BYTES,
    STEM_POOL_THREADS,
    STEM_POOL_TILE_H,
    STEM_POOL_TILE_W,
    STEM_SMEM_BYTES,
    STEM_THREADS,
    STEM_TILE_H,
    STEM_TILE_W,
    STEM_WGMMA_BLOCKS_PER_SM,
    STEM_WGMMA_SMEM_BYTES,
    STEM_WGMMA_THREADS,
    STEM_WGMMA_TILE_H,
    STEM_WGMMA_TILE_W,
    TmaIm2colMap,
    tma_filter_box,
)
from .launch_choices import (
    bindings_launch_choice,
    conv_path,
    path_arch,
    pdl_choice,
)
from .planner import (
    ConvPlan,
    load_tuned_plans,
    make_plan,
    plan_default,
    plan_key,
    served_name_expressions,
    untuned_plan,
)
from .tiles import (
    CLUSTER_SPLITK_MAX,
    STEM_KERNELS,
    STEM_POOL_KERNELS,
    STEM_POOL_WGMMA_KERNELS,
    STEM_TILES,
    PatchConfig,
    PatchWgmmaConfig,
    WgmmaConfig,
    loads_by_tma,
    patch_wgmma_applies,
    patch_wgmma_tiles,
    runs_persistent,
    shortcut_applies,
    shortcut_name_expression,
    without_cuda_bindings,
)


def _ptr(a) -> np.uint64:
    return np.uint64(0 if a is None else a.data.ptr)


def _i(v) -> np.int32:
    return np.int32(v)


def conv_out_size(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def _blocks(total: int, per_block: int) -> int:
    return -(-total // per_block)


# The kernels' argument types (the launchers below build every argument with _ptr or _i) as C types.
_C_TYPES = {np.uint64: ctypes.c_uint64, np.int32: ctypes.c_int32}


def kernel_params(args: tuple) -> tuple[tuple, tuple]:
    """The kernel arguments as cuda.bindings takes them: (values, C types), from the launchers' numpy scalars
    (and the tensor maps of `tma_maps`, cuda.bindings objects that it passes by value: type None)."""
    types = tuple(_C_TYPES.get(type(a)) for a in args)
    return tuple(int(a) if t is not None else a for a, t in zip(args, types)), types


@functools.lru_cache(maxsize=1024)
def tma_maps(x_ptr: int, w_ptr: int, n: int, h: int, w: int, c: int, k: int, r: int, stride: int, pad: int,
             ldw: int, bm: int, bn: int) -> tuple:
    """conv_wgmma_tma's two tensor maps (CUtensorMap, cuTensorMapEncodeIm2col / Tiled from cuda.bindings)
    for an r x r convolution of the fp16 NHWC input at x_ptr with the [k][ldw] filter at w_ptr: the input
    in im2col mode, `bm` rows per load (geometry.TmaIm2colMap), the filter tiled (geometry.tma_filter_box);
    both in the 128-byte swizzle of conv_wgmma's tiles, pixels and rows outside the tensors read as zeros.
    Encoded on the host, no GPU work: cached per pointer and shape, so a graph capture or a timing loop
    encodes each once."""
    from cuda.bindings import driver
    fp16 = driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16
    no_interleave = driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE
    swizzle = driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B
    promotion = driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B
    zeros = driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE

    def u64(values):
        return [driver.cuuint64_t(v) for v in values]

    def u32(values):
        return [driver.cuuint32_t(v) for v in values]

    im2col = TmaIm2colMap.of(n, h, w, c, r, stride, pad, bm)
    err, x_map = driver.cuTensorMapEncodeIm2col(
        fp16, len(im2col.dims), x_ptr, u64(im2col.dims), u64(im2col.strides), list(im2col.lower),
        list(im2col.upper), im2col.channels, im2col.rows, u32(im2col.element_strides), no_interleave, swizzle,
        promotion, zeros)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeIm2col (input {n}x{h}x{w}x{c}, {r}x{r}/{stride}, {bm} rows): {err.name}")
    dims, strides, box = tma_filter_box(ldw, k, bn)
    err, w_map = driver.cuTensorMapEncodeTiled(fp16, len(dims), w_ptr, u64(dims), u64(strides), u32(box), u32((1, 1)),
                                               no_interleave, swizzle, promotion, zeros)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled (filter {k}x{ldw}, box {BK}x{bn}): {err.name}")
    return x_map, w_map


def _launch_plain(kernel, grid, threads: int, args: tuple, shared_mem: int):
    kernel(tuple(grid), (threads,), args, shared_mem=shared_mem)


def _launch_ex(kernel, grid, threads: int, args: tuple, shared_mem: int, programmatic: bool, cluster_z: int = 0):
    """cuLaunchKernelEx: programmatic stream serialization if `programmatic`, thread-block clusters of
    (1, 1, cluster_z) blocks if `cluster_z` (conv_wgmma's CLUSTER_SPLITK: the split-K slices of a tile)."""
    from cuda.bindings import driver
    grid = tuple(grid) + (1,) * (3 - len(grid))
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = threads, 1, 1
    config.sharedMemBytes = shared_mem
    config.hStream = driver.CUstream(cp.cuda.get_current_stream().ptr)
    attributes = []
    if programmatic:
        attribute = driver.CUlaunchAttribute()
        attribute.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attribute.value.programmaticStreamSerializationAllowed = 1
        attributes.append(attribute)
    if cluster_z:
        attribute = driver.CUlaunchAttribute()
        attribute.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attribute.value.clusterDim.x, attribute.value.clusterDim.y, attribute.value.clusterDim.z = 1, 1, cluster_z
        attributes.append(attribute)
    config.attrs = attributes
    config.numAttrs = len(attributes)
    # kernel: CuPy's RawKernel; .kernel is its cupy.cuda.Function on the current device, .ptr the CUfunction
    err, = driver.cuLaunchKernelEx(config, kernel.kernel.ptr, kernel_params(args), 0)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuLaunchKernelEx: {err.name}")


class KernelLibrary:
    """The compiled kernels on one device."""

    def __init__(self, device_id: int, path: str | None = None, pdl: bool | None = None, dev_sources=(),
                 dev_kernels: dict | None = None):
        """`path`: "mma", "wgmma", "mixed", "auto" or None (auto: by compute capability, `conv_path`);
        `pdl`: programmatic dependent launch, None = where possible (`pdl_choice`);
        `dev_sources`, `dev_kernels`: an experiment of kernels/dev/ (its .cu files, appended to the
        translation unit, and {name expression: dynamic shared memory} of its kernels), never served."""
        self.device_id = device_id
        with cp.cuda.Device(device_id):
            device = cp.cuda.Device(device_id)
            cc = device.compute_capability          # "90" for 9.0
            self.cc = (int(cc[:-1]), int(cc[-1]))
            self.path = conv_path(self.cc, path)
            self.pdl, self.pdl_reason = pdl_choice(self.cc, pdl)
            self._mode = threading.local()   # launch_mode's choice, per thread
            self.device_name = cp.cuda.runtime.getDeviceProperties(device_id)["name"].decode()
            self.arch = path_arch(self.path)
            self.wgmma_module = self.arch == WGMMA_ARCH   # both families in one sm_90a module
            self.sms = device.attributes["MultiProcessorCount"]
            # the "wc" tiles (split-K in a cluster) and the "wt" / "wq" tiles (tensor maps) launch through
            # cuLaunchKernelEx, with cuda.bindings
            self.bindings_launch, self.bindings_reason = bindings_launch_choice(self.wgmma_module)
            # Measured best tile/split-K per layer shape (224x224 buckets) on this GPU model, for
            # this path (one family's best, or the best of both on mixed); other shapes and GPUs
            # use the cost model.
            self.tuned = load_tuned_plans(self.device_name, self.path)
            self.source = source_text(self.arch, tuple(dev_sources))
            # every kernel this module can have: the tuner's candidates (and an experiment's)
            self.smem = {**kernel_smem(self.arch), **(dev_kernels or {})}
            # The sm_90a module, and the mma.sync one on the architectures the compile tests build
            # (build.ARCHS), through nvrtc_build: a cubin per kernel, in parallel, cached on disk (CuPy's
            # RawModule never reads its cache for name expressions: it compiles them at every start).
            module_arch = self.arch or (f"sm_{cc}" if f"sm_{cc}" in ARCHS else None)
            self._cache = None
            if module_arch is not None:
                from .nvrtc_build import KernelCache
                self._cache = KernelCache(self.source, nvrtc_options(module_arch))
            self._load_lock = threading.Lock()
            self._modules = []   # the loaded modules (their kernels refer to them)
            self.kernels = {}   # by name expression: those loaded so far
            # What serving can launch (planner.served_name_expressions), compiled now; any other candidate
            # (the tuner's, the checks') when first asked for, or all at once by `load_candidates`.
            self.served = served_name_expressions(self.arch, self.path, self.tuned, self.bindings_launch)
            self.load(self.served)

    def load(self, names):
        """Compile (or read from the disk cache) and load the kernels `names` not loaded yet; on the sm_90a
        module in parallel, one NVRTC program per kernel (nvrtc_build)."""
        with self._load_lock, cp.cuda.Device(self.device_id):
            names = [name for name in dict.fromkeys(names) if name not in self.kernels]
            unknown = [name for name in names if name not in self.smem]
            if unknown:
                raise ValueError(f"not a kernel of the {self.path} path's module: {unknown}")
            if not names:
                return
            functions = {}
            if self._cache is not None:   # a cubin per kernel
                for name, (cubin, lowered) in self._cache.get(names).items():
                    self._modules.append(cp.RawModule(path=str(cubin)))
                    functions[name] = self._modules[-1].get_function(lowered)
            else:   # mma.sync on a newer GPU: CuPy's RawModule for the architecture CuPy picks
                self._modules.append(cp.RawModule(code=self.source, options=COMPILE_OPTIONS, name_expressions=names))
                functions = {name: self._modules[-1].get_function(name) for name in names}
            for name, kernel in functions.items():
                if self.smem[name]:
                    kernel.max_dynamic_shared_size_bytes = self.smem[name]
                self.kernels[name] = kernel

    def load_candidates(self):
        """Every kernel of this path's module (build.name_expressions): what the tuner times and the checks
        run, beside the served ones."""
        self.load(name_expressions(self.arch))

    def kernel(self, name: str):
        """The loaded kernel `name`, compiled first if it is not (a candidate that serving never launches)."""
        kernel = self.kernels.get(name)
        if kernel is None:
            self.load([name])
            kernel = self.kernels[name]
        return kernel

    def _launch(self, kernel, grid, threads: int, args: tuple, shared_mem: int = 0, cluster_z: int = 0,
                tensor_maps: bool = False):
        """Every kernel launch goes through here: `grid` blocks (x[, y[, z]]) of `threads` threads,
        `shared_mem` bytes of dynamic shared memory (the tile's `smem_bytes` / geometry.SMEM_BYTES), on the
        current CuPy stream; programmatic dependent launch where `self.pdl` (and `launch_mode` allows);
        clusters of (1, 1, cluster_z) blocks where cluster_z; through cuda.bindings where `tensor_maps`
        (args holding `tma_maps`' CUtensorMap objects; `bindings_launch` says whether both can)."""
        programmatic = getattr(self._mode, "programmatic", self.pdl)
        if programmatic or cluster_z or tensor_maps:
            if (cluster_z or tensor_maps) and not self.bindings_launch:
                raise RuntimeError(f"cluster launches and tensor maps need compute capability 9.0 and cuda.bindings "
                                   f"(pip install 'fusedresnet[gpu]'): {self.bindings_reason}")
            _launch_ex(kernel, grid, threads, args, shared_mem, programmatic, cluster_z)
        else:
            _launch_plain(kernel, grid, threads, args, shared_mem)

    @contextlib.contextmanager
    def launch_mode(self, programmatic: bool):
        """Launches in this block (this thread) programmatic only if `programmatic` and `self.pdl`."""
        before = getattr(self._mode, "programmatic", self.pdl)
        self._mode.programmatic = self.pdl and programmatic
        try:
            yield
        finally:
            self._mode.programmatic = before

    # -- convolution ---------------------------------------------------------
    def plan(self, n, h, w, c, k, r, s, stride, pad, shortcut_c: int = 0) -> ConvPlan:
        """The launch plan of a convolution: the tuned table's, else `untuned_plan`. `shortcut_c`: the input
        channels of a fused shortcut (`conv_shortcut`), whose k-tiles follow the convolution's."""
        p, q = conv_out_size(h, r, stride, pad), conv_out_size(w, s, stride, pad)
        if c % BK or shortcut_c % BK:
            raise ValueError(f"conv_implicit_gemm needs input channels divisible by {BK}, got C={c}"
                             + (f", shortcut C={shortcut_c}" if shortcut_c else ""))
        m, k_tiles = n * p * q, (r * s * c + shortcut_c) // BK
        tuned = self.tuned.get(plan_key(n, h, w, c, k, r, stride, shortcut_c)) if r == s else None
        if tuned is not None:
            tile = tuned[0] if self.bindings_launch else without_cuda_bindings(tuned[0])
            return make_plan(tile, tuned[1], m, k, k_tiles, n, p, q)
        if r != s:
            return plan_default(m, k, k_tiles, r, self.sms, self.path)
        return untuned_plan(n, h, w, c, k, r, stride, pad, self.sms, self.path, shortcut_c)

    def conv(self, x, weight, bias, y, *, stride, pad, relu, residual=None, plan: ConvPlan | None = None,
             workspace=None):
        """y[N,P,Q,K] = epilogue(conv(x[N,H,W,C] fp16, weight[K,R,S,C] fp16)); see conv_implicit_gemm.cu."""
        n, h, w, c = x.shape
        k, r, s, c2 = weight.shape
        if c2 != c:
            raise ValueError(f"weight has C={c2}, input has C={c}")
        p, q = conv_out_size(h, r, stride, pad), conv_out_size(w, s, stride, pad)
        if y.shape != (n, p, q, k):
            raise ValueError(f"output buffer {y.shape}, expected {(n, p, q, k)}")
        if residual is not None and residual.shape != y.shape:
            raise ValueError(f"residual {residual.shape}, expected {y.shape}")
        plan = plan or self.plan(n, h, w, c, k, r, s, stride, pad)
        self._launch_conv(plan, x, weight, bias, residual, y, workspace, None, None,
                          (n, h, w, c, k, p, q, r, s, stride, pad, r * s * c, r * s * c // BK), relu)

    def conv_shortcut(self, x, weight, bias, y, shortcut, *, shortcut_stride: int, relu: bool = True,
                      plan: ConvPlan | None = None, workspace=None):
        """A downsampling block's second convolution with its 1x1 projection fused in (loaders.cuh):
        y[N,H,W,K] = epilogue(conv3x3/1 pad 1 (x[N,H,W,C]) + conv1x1/shortcut_stride (shortcut[N,Hs,Ws,Cs])),
        weight [K, 9*C + Cs] (each output channel's two KRSC filters, concatenated), bias the sum of theirs.
        Runs on the tiles of `tiles.shortcut_applies`."""
        n, h, w, c = x.shape
        ns, hs, ws, cs = shortcut.shape
        k = bias.shape[0]
        if ns != n or (conv_out_size(hs, 1, shortcut_stride, 0), conv_out_size(ws, 1, shortcut_stride, 0)) != (h, w):
            raise ValueError(f"shortcut input {shortcut.shape} at stride {shortcut_stride} does not give the "
                             f"{(n, h, w)} positions of the input {x.shape}")
        if weight.shape != (k, 9 * c + cs):
            raise ValueError(f"weight {weight.shape}, expected {(k, 9 * c + cs)} (3x3 filter, then the shortcut's)")
        if y.shape != (n, h, w, k):
            raise ValueError(f"output buffer {y.shape}, expected {(n, h, w, k)}")
        plan = plan or self.plan(n, h, w, c, k, 3, 3, 1, 1, shortcut_c=cs)
        if not shortcut_applies(plan.tile):
            raise ValueError(f"{plan.tile.label} has no fused shortcut (tiles.shortcut_applies)")
        main_k_tiles = 9 * c // BK
        self._launch_conv(plan, x, weight, bias, None, y, workspace, None, None,
                          (n, h, w, c, k, h, w, 3, 3, 1, 1, 9 * c + cs, main_k_tiles + cs // BK), relu,
                          (shortcut, hs, ws, cs, shortcut_stride, main_k_tiles))

    def stem(self, x, weight_padded, bias, y, *, kind: str, in_scale=None, in_shift=None, method: str = "patch"):
        """Stem conv 7x7/2 pad 3 + bias + ReLU from uint8 NHWC ("uint8") or fp32 NCHW ("float32") input.

        method "patch": stem.cu (input patch in shared memory); "gemm": the
        generic implicit GEMM with a gathering loader (v2, kept for comparison).
        """
        if method == "patch":
            return self._stem_patch(x, weight_padded, bias, y, kind, in_scale, in_shift)
        tile = STEM_TILES[kind]
        if kind == "uint8":
            n, h, w, c = x.shape
        else:
            n, c, h, w = x.shape
        k = weight_padded.shape[0]
        p, q = conv_out_size(h, 7, 2, 3), conv_out_size(w, 7, 2, 3)
        if y.shape != (n, p, q, k):
            raise ValueError(f"stem output buffer {y.shape}, expected {(n, p, q, k)}")
        m = n * p * q
        k_tiles = STEM_KG_PADDED // BK
        plan = ConvPlan(tile, 1, k_tiles, ((m + tile.bm - 1) // tile.bm, (k + tile.bn - 1) // tile.bn, 1))
        self._launch_conv(plan, x, weight_padded, bias, None, y, None, in_scale, in_shift,
                          (n, h, w, c, k, p, q, 7, 7, 2, 3, STEM_KG_PADDED, k_tiles), True)

    def stem_pool(self, x, weight_padded, bias, y, *, kind: str, in_scale=None, in_shift=None,
                  method: str | None = None):
        """Stem conv + bias + ReLU + 3x3/2 max-pool in one kernel: y is the pooled [N,P2,Q2,64].

        method "wgmma": stem_wgmma.cu (sm_90a); "mma": stem.cu's mma.sync kernel. Default: wgmma where
        the sm_90a module is loaded (the mixed and wgmma paths), else mma (every other GPU, and an H100
        forced to the mma path).
        """
        method = method or ("wgmma" if self.wgmma_module else "mma")
        if method not in ("wgmma", "mma"):
            raise ValueError(f"stem_pool method {method!r}: expected wgmma or mma")
        if method == "wgmma" and not self.wgmma_module:
            raise ValueError(f"the wgmma stem is compiled only on the wgmma and mixed paths (this is {self.path})")
        if kind == "uint8":
            n, h, w, c = x.shape
        else:
            n, c, h, w = x.shape
        k = weight_padded.shape[0]
        p1, q1 = conv_out_size(h, 7, 2, 3), conv_out_size(w, 7, 2, 3)
        p2, q2 = conv_out_size(p1, 3, 2, 1), conv_out_size(q1, 3, 2, 1)
        if c != 3 or k != 64 or weight_padded.shape[1] != STEM_KG_PADDED or y.shape != (n, p2, q2, k):
            raise ValueError(f"stem_pool: input {x.shape}, weight {weight_padded.shape}, output {y.shape}")
        wgmma = method == "wgmma"
        tile_h, tile_w = (STEM_WGMMA_TILE_H, STEM_WGMMA_TILE_W) if wgmma else (STEM_POOL_TILE_H, STEM_POOL_TILE_W)
        tiles_x, tiles_y = _blocks(q2, tile_w), _blocks(p2, tile_h)
        total = n * tiles_x * tiles_y
        args = (_ptr(x), _ptr(weight_padded), _ptr(bias), _ptr(y), _ptr(in_scale), _ptr(in_shift), _i(n), _i(h),
                _i(w), _i(p1), _i(q1), _i(p2), _i(q2), _i(tiles_x), _i(tiles_x * tiles_y), _i(total))
        if wgmma:   # persistent blocks: tiles blockIdx.x, + gridDim.x, ...
            self._launch(self.kernel(STEM_POOL_WGMMA_KERNELS[kind]), (min(total, self.sms * STEM_WGMMA_BLOCKS_PER_SM),),
                    STEM_WGMMA_THREADS, args, STEM_WGMMA_SMEM_BYTES)
        else:
            per_block = self._stem_tiles_per_block(total)
            self._launch(self.kernel(STEM_POOL_KERNELS[kind]), (_blocks(total, per_block),), STEM_POOL_THREADS,
                    args + (_i(per_block),), STEM_POOL_SMEM_BYTES)

    def _stem_tiles_per_block(self, total: int) -> int:
        """Tiles per stem block: up to 8 (the filter is loaded once per block), keeping >= 3 waves of 2 blocks/SM."""
        return max(1, min(8, total // (self.sms * 2 * 3)))

    def _stem_patch(self, x, weight_padded, bias, y, kind, in_scale, in_shift):
        if kind == "uint8":
            n, h, w, c = x.shape
        else:
            n, c, h, w = x.shape
        k = weight_padded.shape[0]
        p, q = conv_out_size(h, 7, 2, 3), conv_out_size(w, 7, 2, 3)
        if c != 3 or k != 64 or weight_padded.shape[1] != STEM_KG_PADDED or y.shape != (n, p, q, k):
            raise ValueError(f"stem: input {x.shape}, weight {weight_padded.shape}, output {y.shape}")
        tiles_x, tiles_y = _blocks(q, STEM_TILE_W), _blocks(p, STEM_TILE_H)
        total = n * tiles_x * tiles_y
        per_block = self._stem_tiles_per_block(total)
        self._launch(self.kernel(STEM_KERNELS[kind]), (_blocks(total, per_block),), STEM_THREADS,
                (_ptr(x), _ptr(weight_padded), _ptr(bias), _ptr(y), _ptr(in_scale), _ptr(in_shift), _i(n), _i(h),
                 _i(w), _i(p), _i(q), _i(tiles_x), _i(tiles_x * tiles_y), _i(total), _i(per_block)),
                STEM_SMEM_BYTES)

    def _launch_conv(self, plan: ConvPlan, x, weight, bias, residual, y, workspace, in_scale, in_shift, dims,
                     relu, shortcut=None):
        """`shortcut`: (input, Hs, Ws, Cs, stride, main k-tiles) of a fused shortcut (`conv_shortcut`)."""
        n, h, w, c, k, p, q, r, s, stride, pad, ldw, k_tiles = dims
        tile = plan.tile
        name = tile.name_expression if shortcut is None else shortcut_name_expression(tile)
        if name not in self.smem:
            raise ValueError(f"{tile.label} is not a kernel of the {self.path} path (cc {self.cc[0]}.{self.cc[1]})")
        kernel = self.kernel(name)
        if isinstance(tile, PatchConfig):
            if not (r == s == 3 and stride == 1 and pad == 1 and c % 64 == 0 and k % tile.bn == 0):
                raise ValueError(f"{tile.label} needs a 3x3/1 pad-1 conv with C % 64 == 0, K % {tile.bn} == 0")
            tiles_x, tiles_y = _blocks(w, tile.tw), _blocks(h, tile.th)
            self._launch(kernel, (n * tiles_x * tiles_y, k // tile.bn, 1), tile.threads,
                    (_ptr(x), _ptr(weight), _ptr(bias), _ptr(residual), _ptr(y), _i(n), _i(h), _i(w), _i(c), _i(k),
                     _i(tiles_x), _i(tiles_x * tiles_y), _i(1 if relu else 0)), tile.smem_bytes)
            return
        if isinstance(tile, PatchWgmmaConfig):
            if r != s or not patch_wgmma_applies(tile, c, k, r, stride, pad, w):
                raise ValueError(f"{tile.label} needs a 3x3/1 pad-1 conv with C == {BK}, K % {tile.bn} == 0 and "
                                 f"W <= its shared-memory limit, got C={c}, K={k}, W={w}")
            tiles = patch_wgmma_tiles(tile, n, h, w)
            # persistent blocks, one wave of one per SM (the filter slice and patches fill its shared memory)
            self._launch(kernel, (min(tiles, max(1, self.sms // (k // tile.bn))), k // tile.bn, 1), tile.threads,
                         (_ptr(x), _ptr(weight), _ptr(bias), _ptr(residual), _ptr(y), _i(n), _i(h), _i(w), _i(k),
                          _i(tiles), _i(1 if relu else 0)), tile.smem_for(w))
            return
        partial = None
        cluster_z = plan.splits if plan.cluster_splitk else 0
        if cluster_z > CLUSTER_SPLITK_MAX:
            raise ValueError(f"{tile.label} reduces split-K in a cluster of at most {CLUSTER_SPLITK_MAX} slices, "
                             f"got {plan.splits}")
        need = plan.workspace_floats(n * p * q * k)
        if need:
            if workspace is None or workspace.size < need:
                raise ValueError(f"split-K x{plan.splits} needs a float32 workspace of {need} elements")
            partial = workspace
        shortcut_x, shortcut_h, shortcut_w, shortcut_c, shortcut_stride, main_k_tiles = (
            shortcut if shortcut is not None else (None, 0, 0, 0, 1, k_tiles))
        tail = (_i(n), _i(h), _i(w), _i(c), _i(k), _i(p), _i(q), _i(r), _i(s), _i(stride), _i(pad), _i(ldw),
                _i(k_tiles), _i(plan.k_tiles_per_split), _i(1 if relu else 0), _ptr(shortcut_x), _i(shortcut_h),
                _i(shortcut_w), _i(shortcut_c), _i(shortcut_stride), _i(main_k_tiles))
        if isinstance(tile, WgmmaConfig):   # no stem inputs (ConvInput.STEM_*): no in_scale / in_shift
            if in_scale is not None or in_shift is not None or c % BK or k % 8:
                raise ValueError(f"{tile.label} runs fp16 NHWC convolutions with C % {BK} == 0 and K % 8 == 0 "
                                 f"(the stem has its own kernels), got C={c}, K={k}")
            args = (_ptr(x), _ptr(weight), _ptr(bias), _ptr(residual), _ptr(y), _ptr(partial)) + tail
        else:
            args = (_ptr(x), _ptr(weight), _ptr(bias), _ptr(residual), _ptr(y), _ptr(partial), _ptr(in_scale),
                    _ptr(in_shift)) + tail
        grid = plan.grid
        if runs_persistent(tile):   # persistent blocks: at most blocks_per_sm per SM, each running tiles on
            grid = (max(1, min(plan.grid[0], self.sms * tile.blocks_per_sm)), 1, 1)
        tma = loads_by_tma(tile)
        if tma:   # conv_wgmma_tma: the input's and the filter's tensor maps after the common arguments
            if shortcut is not None or r != s:
                raise ValueError(f"{tile.label} runs square convolutions without a fused shortcut")
            args += tma_maps(x.data.ptr, weight.data.ptr, n, h, w, c, k, r, stride, pad, ldw, tile.bm, tile.bn)
        self._launch(kernel, grid, tile.threads, args, tile.smem_bytes, cluster_z, tma)
        if partial is not None:
            m = n * p * q
            self._launch(self.kernel("splitk_epilogue"), (_blocks(m * (k // 8), EW_THREADS),), EW_THREADS,
                    (_ptr(partial), _i(plan.splits), _ptr(bias), _ptr(residual), _ptr(y), _i(m), _i(k),
                     _i(1 if relu else 0)))

    # -- pool and head -------------------------------------------------------
    def maxpool_3x3s2(self, x, y):
        n, h, w, c = x.shape
        p, q = conv_out_size(h, 3, 2, 1), conv_out_size(w, 3, 2, 1)
        if y.shape != (n, p, q, c) or c % 8:
            raise ValueError(f"maxpool: input {x.shape}, output {y.shape}")
        self._launch(self.kernel("maxpool_3x3s2"), (_blocks(n * p * q * (c // 8), EW_THREADS),), EW_THREADS,
                (_ptr(x), _ptr(y), _i(n), _i(h), _i(w), _i(c), _i(p), _i(q)))

    def avgpool_fc(self, x, weight, bias, logits):
        n, h, w, c = x.shape
        classes = weight.shape[0]
        if c != 512 or weight.shape[1] != 512 or logits.shape != (n, classes):
            raise ValueError(f"avgpool_fc: features {x.shape}, weight {weight.shape}, logits {logits.shape}")
        self._launch(self.kernel(f"avgpool_fc<{HEAD_IMGS}>"), (HEAD_BLOCKS_X, _blocks(n, HEAD_IMGS)), HEAD_THREADS,
                (_ptr(x), _ptr(weight), _ptr(bias), _ptr(logits), _i(n), _i(h * w), _i(classes),
                 _i(_blocks(classes, HEAD_BLOCKS_X))))


def library(device_id: int, path: str | None = None, pdl: bool | None = None) -> KernelLibrary:
    """The kernels compiled for one device, conv path (default: auto, `launch_choices.conv_path`) and launch mode
    (default: `pdl_choice`), built once per process."""
    with cp.cuda.Device(device_id):
        cc = cp.cuda.Device(device_id).compute_capability
    cc = (int(cc[:-1]), int(cc[-1]))
    return _library(device_id, conv_path(cc, path), pdl)


@functools.cache
def _library(device_id: int, path: str, pdl: bool | None) -> KernelLibrary:
    return KernelLibrary(device_id, path, pdl)
