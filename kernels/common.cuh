// Small PTX wrappers shared by the kernels of fusedresnet.
//
// The kernels include no CUDA headers at all: fp16 values travel as raw
// 16-bit patterns (unsigned short) or packed pairs (unsigned int), and the few
// conversions and the tensor-core instructions are inline PTX. That keeps the
// sources identical under NVRTC (what CuPy compiles with at run time) and nvcc
// (what the CPU compile test and the SASS inspection use), with no include
// paths to get wrong. The Python launcher (build.source_text) pastes this
// file and the other headers (epilogue.cuh, loaders.cuh) once at the top of the
// translation unit and drops the #include lines, so CuPy's kernel cache (keyed
// on the source text) sees every change.
#ifndef FUSEDRESNET_COMMON_CUH
#define FUSEDRESNET_COMMON_CUH

typedef unsigned long long u64;      // 64-bit index arithmetic (NVRTC has no size_t without headers)
typedef unsigned short half_bits;   // one IEEE fp16 value, as bits
typedef unsigned int half2_bits;    // two fp16 values: low 16 bits = first (lower address)

struct alignas(16) vec16 { unsigned int x, y, z, w; };  // 16 bytes = 8 fp16

// The implicit-GEMM tiles: rows of BK = 64 fp16 values (128 bytes), the 16-byte
// chunk j of row r stored at chunk position j ^ (r & 7). Eight consecutive rows
// (1024 bytes) form one swizzle atom: ldmatrix phases hit eight different bank
// groups, and it is exactly the 128-byte swizzle of a Hopper wgmma shared-memory
// descriptor (conv_wgmma.cu), for tiles that start on a 1024-byte boundary.
// BK itself, like every fixed size of the kernels, comes from geometry.GEOMETRY
// (pasted before this file).

// Offset (in halfs) of 16-byte chunk `chunk` of row `row` in a swizzled [rows][64] tile.
__device__ __forceinline__ int swz(int row, int chunk) { return row * BK + ((chunk ^ (row & 7)) << 3); }

__device__ __forceinline__ half2_bits pack_half2(float lo, float hi) {
    half2_bits r;
    // cvt.rn.f16x2.f32 d, a, b puts a in the upper half, b in the lower half.
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float2 float_pair(float x, float y) {
    float2 r;
    r.x = x; r.y = y;
    return r;
}

__device__ __forceinline__ half_bits float_to_half(float v) {
    half_bits r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(v));
    return r;
}

__device__ __forceinline__ float half_to_float(half_bits h) {
    float r;
    asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(h));
    return r;
}

__device__ __forceinline__ void unpack_half2(half2_bits v, float &lo, float &hi) {
    lo = half_to_float((half_bits)(v & 0xffffu));
    hi = half_to_float((half_bits)(v >> 16));
}

__device__ __forceinline__ half2_bits hmax2(half2_bits a, half2_bits b) {
    half2_bits r;
    asm("max.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

// Quotient and remainder by a divisor fixed for the whole kernel, without the ~25-instruction
// integer division sequence per use (the method of CUTLASS's FastDivmod, Granlund and Montgomery's
// division by invariant integers): with l = ceil(log2 d) and p = 31 + l, m = ceil(2^p / d) < 2^32,
// and for every 0 <= n < 2^31, floor(n / d) = floor(n * m / 2^p) = umulhi(n, m) >> (l - 1): the
// product overshoots n / d by n * (m d - 2^p) / (d 2^p) < 2^31 / 2^p <= 1 / d, less than the gap
// from n / d to the next integer. d = 1 (l = 0) is passed through. Built once per thread (one
// 64-bit division), then three instructions per quotient. tests/test_fast_divmod.py checks the
// arithmetic on the CPU for every divisor the kernels use and at the ends of the range.
struct fast_divmod {
    int divisor;
    unsigned int multiplier, shift;
    __device__ __forceinline__ explicit fast_divmod(int d) : divisor(d), multiplier(0u), shift(0u) {
        if (d > 1) {
            const unsigned int l = 32u - (unsigned int)__clz(d - 1);   // ceil(log2 d)
            multiplier = (unsigned int)(((1ull << (31u + l)) + (u64)d - 1ull) / (u64)d);
            shift = l - 1u;
        }
    }
    // floor(n / d) for 0 <= n < 2^31.
    __device__ __forceinline__ int div(int n) const {
        return divisor == 1 ? n : (int)(__umulhi((unsigned int)n, multiplier) >> shift);
    }
    // floor(n / d), with n mod d in rem.
    __device__ __forceinline__ int divmod(int &rem, int n) const {
        const int q = div(n);
        rem = n - q * divisor;
        return q;
    }
};

// The 4x4 transpose of 32-bit words across the 4 lanes of a quad (lanes 4q .. 4q+3, t = lane % 4): lane t
// holds a[c] = M[t][c] and ends with a[r] = M[r][t]. Two rounds of two shuffles (partner t^1, then t^2);
// every lane of the warp takes part. With 4-byte fragments (thread t holds channels 8j + 2t, +1 of a row)
// it turns words j = 0..3 into one lane's 16 contiguous bytes (channels 8t .. 8t+7), and back.
__device__ __forceinline__ void quad_transpose4(unsigned int (&a)[4], int t) {
    const bool odd = t & 1, high = t & 2;
#pragma unroll
    for (int k = 0; k < 2; ++k) {   // columns 2k, 2k+1: keep column 2k + odd, trade the other with t^1
        const unsigned int got = __shfl_xor_sync(0xffffffffu, odd ? a[2 * k] : a[2 * k + 1], 1);
        if (odd) a[2 * k] = got; else a[2 * k + 1] = got;
    }
    // now a[2k + b] = M[the row of t, t^1 with bit 0 = b][2k + odd]: keep pair k = high, trade the other with t^2
    const unsigned int got0 = __shfl_xor_sync(0xffffffffu, high ? a[0] : a[2], 2);
    const unsigned int got1 = __shfl_xor_sync(0xffffffffu, high ? a[1] : a[3], 2);
    if (high) { a[0] = got0; a[1] = got1; } else { a[2] = got0; a[3] = got1; }
}

__device__ __forceinline__ unsigned int smem_addr(const void *p) {
    return (unsigned int)__cvta_generic_to_shared(p);
}

// A 16-byte read-only global load issued where it stands: asm volatile keeps it before the barriers
// that follow (ptxas sank a plain load of a __restrict__ pointer past a cluster barrier to its use).
// For loads a kernel issues early on purpose, from memory no thread of this kernel writes.
__device__ __forceinline__ vec16 ld_global_nc_16_early(const void *p) {
    vec16 v;
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// 16-byte asynchronous global->shared copy. src_bytes = 0 writes 16 zero bytes
// without reading global memory: that is how the implicit-GEMM loader pads.
__device__ __forceinline__ void cp_async_16(unsigned int dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(unsigned int addr, unsigned int &r0, unsigned int &r1,
                                            unsigned int &r2, unsigned int &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

// D = A * B + D, m16n8k16, fp16 inputs, fp32 accumulators (row.col: A is M x K
// row-major, B is given as N x K "K-major", which is exactly a KRSC filter).
__device__ __forceinline__ void mma_16816(float *d, const unsigned int *a, const unsigned int *b) {
    // Not volatile: a pure register operation, which the compiler may
    // interleave with the (volatile, ordered) ldmatrix loads.
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Programmatic dependent launch (launch.py launches every kernel with it on
// compute capability >= 9.0 where the engine asks for it). Two instructions:
//   griddepcontrol.launch_dependents  lets the next kernel of the stream (or
//     graph) be scheduled once every block of this one has issued it (or
//     exited), so its launch and prologue overlap this grid's tail
//     (NOTES.md outcome 12: 3-7% at small batches);
//   griddepcontrol.wait  waits until the kernels this one depends on have
//     completed and their writes are visible (returns at once when the kernel
//     was launched without the attribute).
// Every kernel waits before its first access to memory another kernel writes
// (the activations; only its own weights, which no kernel writes, may be read
// or prefetched before: pdl_begin_prefetch_l2), so each kernel still sees
// every earlier kernel complete (by induction along the stream): the order of
// reads and writes is that of a plain launch. Where each block
// triggers: at its start (pdl_begin, pdl_begin_prefetch_l2 with trigger_now)
// in the element-wise kernels, the head and the mma.sync convolutions; after
// its main loop (pdl_trigger, before the epilogue) in the sm_90a kernels the
// H100 runs, conv_wgmma, conv_wgmma_tma, conv3x3_patch_wgmma and
// stem_pool_wgmma (the persistent ones: before their last tile's epilogue;
// conv_wgmma_tma's producer warp exits instead). Measured on the H100
// (NOTES.md outcome 23), against the trigger at their start: the network
// 3% faster at batch 1 and 8, 1.5% at 16, 2% slower at 2 and 4. Before sm_90
// all of these are no-ops (no such instructions; launch.py launches plainly).
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n\tgriddepcontrol.wait;\n" ::: "memory");
#endif
}

// pdl_begin (the trigger only if trigger_now) with an L2 prefetch before the wait: `rows`
// segments of `bytes` bytes (16-byte aligned, a multiple of 16), `stride` bytes
// apart, from `base`. Only for the weights (filters, fc): no kernel writes
// them, so touching them before the wait cannot see a stale value (and a
// prefetch only warms L2, through which every write goes). A kernel whose
// blocks are resident early (PDL) so fetches its weights while the kernel
// before it still runs: at small batches the convolutions stream their
// filters from HBM with little else to overlap. With wait_now false the kernel
// calls pdl_wait() itself, later: what it does in between (index arithmetic,
// copies of its weights) reads nothing another kernel writes, and runs while
// the kernel before it finishes. The sm_90a convolutions set up that way (their
// address arithmetic and fast_divmod builds are ~450 instructions between the
// wait and the first copy of the main loop: SASS, kernels/NOTES.md).
__device__ __forceinline__ void pdl_begin_prefetch_l2(const void *base, int rows, unsigned int bytes, u64 stride,
                                                      bool trigger_now = true, bool wait_now = true) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (trigger_now) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    for (int r = threadIdx.x; r < rows; r += blockDim.x)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n"
                     :: "l"(static_cast<const char *>(base) + r * stride), "r"(bytes) : "memory");
    if (wait_now) asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// The filter slice one convolution block reads (output channels n0 ..
// n0 + bn - 1 of K, k-tiles kt_begin .. kt_end - 1 of a [K][ldw] filter),
// prefetched by the first block along M only (the others read the same slice).
__device__ __forceinline__ void pdl_begin_prefetch_filter_slice(const half_bits *w, int n0, int bn, int K, int ldw,
                                                                int kt_begin, int kt_end, bool first_m,
                                                                bool trigger_now = true, bool wait_now = true) {
    pdl_begin_prefetch_l2(w + (u64)n0 * ldw + (u64)kt_begin * BK, first_m ? min(bn, K - n0) : 0,
                          (unsigned int)(kt_end - kt_begin) * BK * 2, (u64)ldw * 2, trigger_now, wait_now);
}

// The same for the split-K implicit-GEMM grid (blockIdx.x: M tile, .y: the bn
// output channels from blockIdx.y * bn, .z: the split of k_tiles_per_split
// k-tiles), as conv_implicit_gemm, conv_wgmma and conv_wgmma_ws launch (the
// persistent conv_wgmma and conv_wgmma_tma pass bn = K: the whole filter).
__device__ __forceinline__ void pdl_begin_prefetch_filter(const half_bits *w, int bn, int K, int ldw,
                                                          int num_k_tiles, int k_tiles_per_split,
                                                          bool trigger_now = true, bool wait_now = true) {
    pdl_begin_prefetch_filter_slice(w, blockIdx.y * bn, bn, K, ldw, blockIdx.z * k_tiles_per_split,
                                    min(num_k_tiles, (int)(blockIdx.z + 1) * k_tiles_per_split), blockIdx.x == 0,
                                    trigger_now, wait_now);
}
#endif  // FUSEDRESNET_COMMON_CUH
