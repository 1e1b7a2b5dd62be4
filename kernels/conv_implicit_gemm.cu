// Convolution as implicit GEMM on tensor cores, with a fused epilogue.
//
// IMPLICIT GEMM. An NHWC convolution y[n,p,q,k] = sum_{r,s,c} x[n, p*st-pad+r,
// q*st-pad+s, c] * w[k,r,s,c] is a matrix product D = A * B^T with
//     M  = N*P*Q   rows of A and D: one per output pixel (n,p,q)
//     Nk = K       rows of B, columns of D: one per output channel
//     Kg = R*S*C   the reduction: one per filter tap (r,s) and input channel c
// B is the KRSC filter itself (K rows, Kg contiguous values each). A is the
// im2col matrix, never written out: row m, column kg=(r*S+s)*C+c is input pixel
// (p*st-pad+r, q*st-pad+s) of image n, channel c, or 0 outside the image. With
// C a multiple of 64, a BK=64 slice of the reduction lies inside one filter tap,
// so each A row of a k-tile is 64 contiguous channels of one input pixel: 128
// bytes that eight 16-byte cp.async copies fetch, zero-filled (src-size 0) where
// the tap falls on the padding. The output D is row-major [M, K]: NHWC again.
//
// TILING. A thread block computes a BM x BN tile of D; its WARPS_M x WARPS_N
// warps each own a (BM/WARPS_M) x (BN/WARPS_N) sub-tile in fp32 registers,
// updated by mma.sync m16n8k16 from ldmatrix fragments (warp_mma.cuh). The
// reduction runs over k-tiles of BK=64 through a STAGES-deep ring of [BM][64]
// A and [BN][64] B tiles in shared memory (swizzled rows, common.cuh), filled
// by cp.async (loaders.cuh), so the copies of the next STAGES-1 k-tiles
// overlap the tensor-core work on the current one.
//
// SPLIT-K. Layers with few output tiles (layer3/layer4 at small batch) would
// leave most of the 132 SMs idle, so gridDim.z slices the reduction: slice z
// writes its fp32 partial sums to `partial[z]` and `splitk_epilogue` (below)
// adds the slices and applies the epilogue. With gridDim.z == 1 the epilogue
// runs here.
//
// EPILOGUE: epilogue.cuh's (bias, residual, ReLU, fp16 NHWC, or the split-K
// partials), straight from the accumulator fragments.
//
// INPUT (enum class ConvInput, generated from tiles.ConvInput) names what
// the A operand, the im2col rows, is gathered from.
//
// FUSED SHORTCUT (FP16_NHWC_FUSED_SHORTCUT, else as FP16_NHWC): k-tiles from
// main_k_tiles on are a downsampling block's 1x1 projection of shortcut_x,
// summed into this 3x3/1 conv's reduction (loaders.cuh). A separate
// instantiation, so that FP16_NHWC's k-loop stays as it was (a run-time branch
// in it cost 5-13% at batch 8).
//
// STEM (STEM_UINT8_NHWC, STEM_FP32_NCHW: the reference path of stem.cu, which
// explains the stem's inputs and its [K][8 r][24] filter layout): the reduction of 147
// values is not a multiple of 64 and the input is UINT8 NHWC or fp32 NCHW, so
// a gather replaces the cp.async A loader and converts (and, for UINT8,
// normalises) each value on its way into shared memory. In that filter layout
// each 8-value chunk of an A row is a run of contiguous input values.
//
// Versions (measurements in NOTES.md):
//   v1  mma.sync m16n8k16 + ldmatrix + cp.async ring, direct fragment stores,
//       split-K through an fp32 workspace.
//   v2  stem loader gathers runs of 8 contiguous input values per chunk (index
//       arithmetic once per chunk, not per value). (The stem now has its own
//       kernel, stem.cu; the STEM_* inputs stay as its reference path.)
//   v3  fragments double-buffered across k16 steps; mma not volatile.

#include "common.cuh"
#include "epilogue.cuh"
#include "loaders.cuh"
#include "warp_mma.cuh"

template <int BM, int BN>
struct TileSmem {
    static constexpr int A_HALFS = BM * BK;
    static constexpr int B_HALFS = BN * BK;
    static constexpr int STAGE_HALFS = A_HALFS + B_HALFS;
};

template <int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, ConvInput INPUT>
__global__ void __launch_bounds__(WARPS_M * WARPS_N * 32)
conv_implicit_gemm(const void *__restrict__ x_, const half_bits *__restrict__ w, const float *__restrict__ bias,
                   const half_bits *__restrict__ residual, half_bits *__restrict__ y, float *__restrict__ partial,
                   const float *__restrict__ in_scale, const float *__restrict__ in_shift,
                   int N, int H, int W, int C, int K, int P, int Q, int R, int S, int stride, int pad,
                   int ldw, int num_k_tiles, int k_tiles_per_split, int relu,
                   const half_bits *__restrict__ shortcut_x, int shortcut_h, int shortcut_w, int shortcut_c,
                   int shortcut_stride, int main_k_tiles) {
    pdl_begin_prefetch_filter(w, BN, K, ldw, num_k_tiles, k_tiles_per_split);   // common.cuh
    constexpr int THREADS = WARPS_M * WARPS_N * 32;
    constexpr bool NHWC = INPUT == ConvInput::FP16_NHWC || INPUT == ConvInput::FP16_NHWC_FUSED_SHORTCUT;   // else stem
    constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;   // warp tile
    constexpr int MI = WTM / 16, NI = WTN / 8;              // mma tiles per warp
    static_assert((BM * 8) % THREADS == 0 && (BN * 8) % THREADS == 0, "loader mapping");
    constexpr int A_ITERS = BM * 8 / THREADS, B_ITERS = BN * 8 / THREADS;
    constexpr int ROW_STEP = THREADS / 8;
    static_assert(STAGES * TileSmem<BM, BN>::STAGE_HALFS * 2 <= conv_smem_bytes(BM, BN, STAGES), "smem layout");

    extern __shared__ vec16 smem_vec[];
    half_bits *smem = reinterpret_cast<half_bits *>(smem_vec);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;
    const int M = N * P * Q;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    const int kt_begin = blockIdx.z * k_tiles_per_split;
    const int kt_end = min(num_k_tiles, kt_begin + k_tiles_per_split);
    const int nkt = kt_end - kt_begin;

    // Per-thread loader state: which output pixels (A rows) this thread copies.
    const int chunk = tid & 7;
    int a_base[A_ITERS], a_ih[A_ITERS], a_iw[A_ITERS];
    igemm_a_rows<A_ITERS, ROW_STEP>(a_base, a_ih, a_iw, m0, tid, M, H, W, C, P, Q, stride, pad);   // loaders.cuh
    const int c_tiles = C / BK;   // the FP16_NHWC inputs only

    // Stem loader state (the STEM_* inputs): the output pixel of A row tid % BM.
    u64 stem_base = 0;
    int stem_ih0 = -(1 << 20), stem_iw0 = 0;
    if constexpr (!NHWC) {
        const int m = m0 + tid % BM;
        if (m < M) {
            const int n = m / (P * Q), pq = m - n * (P * Q), p = pq / Q, q = pq - p * Q;
            stem_base = (u64)n * H * W * 3;
            stem_ih0 = p * stride - pad;
            stem_iw0 = q * stride - pad;
        }
    }

    auto load_tile = [&](int stage, int kt) {
        half_bits *sA = smem + stage * TileSmem<BM, BN>::STAGE_HALFS;
        half_bits *sB = sA + TileSmem<BM, BN>::A_HALFS;
        igemm_load_b<B_ITERS, ROW_STEP>(sB, w, n0, K, ldw, kt, tid, chunk);
        if constexpr (INPUT == ConvInput::FP16_NHWC_FUSED_SHORTCUT) {
            if (kt < main_k_tiles)
                igemm_load_a<A_ITERS, ROW_STEP>(sA, reinterpret_cast<const half_bits *>(x_), a_base, a_ih, a_iw, kt,
                                                c_tiles, S, H, W, C, tid, chunk);
            else   // the fused shortcut's k-tiles (loaders.cuh)
                igemm_load_a_shortcut<A_ITERS, ROW_STEP>(sA, shortcut_x, a_base, a_ih, a_iw, kt - main_k_tiles,
                                                         1.f / (H * W * C), pad, shortcut_h, shortcut_w, shortcut_c,
                                                         shortcut_stride, tid, chunk);
        } else if constexpr (INPUT == ConvInput::FP16_NHWC) {
            igemm_load_a<A_ITERS, ROW_STEP>(sA, reinterpret_cast<const half_bits *>(x_), a_base, a_ih, a_iw, kt,
                                            c_tiles, S, H, W, C, tid, chunk);
        } else {
            // Stem gather. For a fixed output pixel and filter row r the 21
            // values j = s*3 + c are 7 consecutive input pixels x 3 channels,
            // 21 contiguous bytes of a UINT8 NHWC image. Chunk g of the
            // reduction is filter row g/3, values (g%3)*8 ... +7. Each thread
            // converts CHUNKS chunks of one A row; the chunk index is
            // warp-uniform, so r and the channel pattern are too.
            static_assert(THREADS % BM == 0 && BM % 32 == 0, "stem loader mapping");
            constexpr int CHUNKS = 8 * BM / THREADS;
            const int row = tid % BM, group = tid / BM;
#pragma unroll
            for (int ci = 0; ci < CHUNKS; ++ci) {
                const int chunk_in_tile = group * CHUNKS + ci;
                const int g = kt * 8 + chunk_in_tile;
                const int r = g / 3, part = g - r * 3;
                const int ih = stem_ih0 + r;
                const bool row_ok = r < 7 && (unsigned)ih < (unsigned)H;
                float v[8];
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    const int j = part * 8 + e;
                    const int sx = j / 3, c = j - sx * 3;
                    const int iw = stem_iw0 + sx;
                    float val = 0.f;
                    if (row_ok && j < 21 && (unsigned)iw < (unsigned)W) {
                        if constexpr (INPUT == ConvInput::STEM_UINT8_NHWC) {
                            const unsigned char *x = reinterpret_cast<const unsigned char *>(x_);
                            val = (float)x[stem_base + ((u64)ih * W + iw) * 3 + c] * in_scale[c] + in_shift[c];
                        } else {
                            const float *x = reinterpret_cast<const float *>(x_);
                            val = x[stem_base + ((u64)c * H + ih) * W + iw];
                        }
                    }
                    v[e] = val;
                }
                vec16 out;
                out.x = pack_half2(v[0], v[1]); out.y = pack_half2(v[2], v[3]);
                out.z = pack_half2(v[4], v[5]); out.w = pack_half2(v[6], v[7]);
                *reinterpret_cast<vec16 *>(sA + swz(row, chunk_in_tile)) = out;
            }
        }
    };

    float acc[MI][NI][4];
    warp_mma_zero(acc);

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nkt) load_tile(s, kt_begin + s);
        cp_async_commit();
    }

    for (int i = 0; i < nkt; ++i) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        int next = i + STAGES - 1;
        if (next < nkt) load_tile(next % STAGES, kt_begin + next);
        cp_async_commit();

        const half_bits *sA = smem + (i % STAGES) * TileSmem<BM, BN>::STAGE_HALFS;
        const half_bits *sB = sA + TileSmem<BM, BN>::A_HALFS;
        WarpFrags<MI, NI> frags;
        warp_mma_pipelined<MI, NI, BK / 16>(acc, frags, lane, warp_m, warp_n,   // warp_mma.cuh
                                            [&](int, int row, int ch) { return smem_addr(sA + swz(row, ch)); },
                                            [&](int row, int ch) { return smem_addr(sB + swz(row, ch)); });
    }
    cp_async_wait<0>();

    // Epilogue straight from the accumulator fragments (layout: epilogue.cuh).
    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
        for (int half_row = 0; half_row < 2; ++half_row) {
            int m = m0 + warp_m * WTM + mi * 16 + g + half_row * 8;
            if (m >= M) continue;
#pragma unroll
            for (int ni = 0; ni < NI; ++ni) {
                int k = n0 + warp_n * WTN + ni * 8 + 2 * t4;
                if (k >= K) continue;
                epilogue_pair_or_partial(acc[mi][ni][half_row * 2], acc[mi][ni][half_row * 2 + 1], k,
                                         (u64)m * K + k, M, K, bias, residual, y, partial, relu);
            }
        }
    }
}

// Sum of the split-K slices + the same epilogue, 8 channels (16 bytes of
// output) per thread. K must be a multiple of 8.
__global__ void __launch_bounds__(EW_THREADS)
splitk_epilogue(const float *__restrict__ partial, int splits, const float *__restrict__ bias,
                const half_bits *__restrict__ residual, half_bits *__restrict__ y, int M, int K, int relu) {
    pdl_begin();   // common.cuh: before any global access
    const int groups = K / 8;
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)M * groups) return;
    const int m = (int)(idx / groups), k = (int)(idx - (long long)m * groups) * 8;
    const u64 off = (u64)m * K + k;
    float v[8];
    {
        const float4 b0 = *reinterpret_cast<const float4 *>(bias + k);
        const float4 b1 = *reinterpret_cast<const float4 *>(bias + k + 4);
        v[0] = b0.x; v[1] = b0.y; v[2] = b0.z; v[3] = b0.w; v[4] = b1.x; v[5] = b1.y; v[6] = b1.z; v[7] = b1.w;
    }
    for (int s = 0; s < splits; ++s) {
        const float *p = partial + (u64)s * M * K + off;
        const float4 p0 = *reinterpret_cast<const float4 *>(p);
        const float4 p1 = *reinterpret_cast<const float4 *>(p + 4);
        v[0] += p0.x; v[1] += p0.y; v[2] += p0.z; v[3] += p0.w; v[4] += p1.x; v[5] += p1.y; v[6] += p1.z; v[7] += p1.w;
    }
    epilogue_store8(v, off, residual, y, relu);
}
