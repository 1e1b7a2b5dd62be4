// 3x3 / stride 1 / pad 1 convolution as implicit GEMM with the input patch
// held in shared memory, for the wide early layers (layer1, layer2).
//
// conv_implicit_gemm.cu re-reads each input pixel once per filter tap: the A
// tile of k-tile (tap, channel slice) is 128 shifted input pixels, fetched from
// L2 again for each of the 9 taps. With only 64 output channels per block
// (layer1: K=64) that is 2 bytes of L2 traffic per 64 MACs, and layer1 ran at
// the L2 bandwidth limit (~2.9 TB/s, 180 TFLOP/s). Here a block owns a TH x TW
// tile of output pixels of one image (the BM = TH*TW rows of its GEMM tile),
// copies the (TH+2) x (TW+2) x 64-channel input patch into shared memory once
// per 64-channel slice, and takes all 9 taps from it: the A fragment of output
// pixel (py,px) for tap (r,s) is patch pixel (py+r, px+s), an address that each
// lane hands to ldmatrix. The filter still streams through a STAGES-deep
// cp.async ring, one (slice, tap) k-tile per stage; the patch of slice cc+1 is
// copied together with the filter tile of (cc+1, tap 0), into the other of two
// patch buffers. The patch pixels and the filter rows are swizzled 128-byte
// rows (common.cuh); the warp tile is warp_mma.cuh's.
//
// The epilogue is epilogue.cuh's; rows outside the image are dropped. With
// SMEM_EPILOGUE the accumulators (+ bias) go through shared memory first, so
// that the residual loads and output stores are 16 bytes per thread and
// coalesced (epilogue_store8).

#include "common.cuh"
#include "epilogue.cuh"
#include "warp_mma.cuh"

template <int TH, int TW, int BN, int WARPS_M, int WARPS_N, int STAGES, bool SMEM_EPILOGUE>
__global__ void __launch_bounds__(WARPS_M * WARPS_N * 32)
conv3x3_patch(const half_bits *__restrict__ x, const half_bits *__restrict__ w, const float *__restrict__ bias,
              const half_bits *__restrict__ residual, half_bits *__restrict__ y,
              int N, int H, int W, int C, int K, int tiles_x, int tiles_per_image, int relu) {
    pdl_begin_prefetch_filter_slice(w, blockIdx.y * BN, BN, K, 9 * C, 0, 9 * C / BK, blockIdx.x == 0);   // common.cuh
    constexpr int BM = TH * TW;
    constexpr int THREADS = WARPS_M * WARPS_N * 32;
    constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;
    constexpr int MI = WTM / 16, NI = WTN / 8;
    constexpr int PH = TH + 2, PW = TW + 2, PATCH_PIX = PH * PW;
    constexpr int PATCH_HALFS = PATCH_PIX * 64;
    constexpr int B_HALFS = BN * 64;
    constexpr int B_ITERS = BN * 8 / THREADS;
    static_assert(NI % 2 == 0 && (BN * 8) % THREADS == 0 && BM % (16 * WARPS_M) == 0, "tile shape");
    static_assert((2 * PATCH_HALFS + STAGES * B_HALFS) * 2 <= patch_smem_bytes(TH, TW, BN, STAGES), "smem layout");

    extern __shared__ vec16 smem_vec[];
    half_bits *patch = reinterpret_cast<half_bits *>(smem_vec);      // [2][PATCH_PIX][64]
    half_bits *ring = patch + 2 * PATCH_HALFS;                        // [STAGES][BN][64]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;
    const int tile = blockIdx.x;
    const int n = tile / tiles_per_image, rem = tile - n * tiles_per_image;
    const int ty = rem / tiles_x, tx = rem - ty * tiles_x;
    const int oy0 = ty * TH, ox0 = tx * TW;
    const int n0 = blockIdx.y * BN;
    const int slices = C / 64, num_k = 9 * slices;
    const int ldw = 9 * C;
    const int chunk = tid & 7;

    auto load_stage = [&](int stage, int it) {
        const int cc = it / 9, tap = it - cc * 9;
        half_bits *sB = ring + stage * B_HALFS;
#pragma unroll
        for (int i = 0; i < B_ITERS; ++i) {
            const int row = tid / 8 + i * (THREADS / 8);
            const half_bits *src = w + (u64)(n0 + row) * ldw + tap * C + cc * 64 + chunk * 8;
            cp_async_16(smem_addr(sB + row * 64 + ((chunk ^ (row & 7)) << 3)), src, 16);
        }
        if (tap == 0) {
            half_bits *dst = patch + (cc & 1) * PATCH_HALFS;
            for (int idx = tid; idx < PATCH_PIX * 8; idx += THREADS) {
                const int pix = idx >> 3, ch = idx & 7;
                const int py = pix / PW, px = pix - py * PW;
                const int gy = oy0 - 1 + py, gx = ox0 - 1 + px;
                const bool ok = (unsigned)gy < (unsigned)H && (unsigned)gx < (unsigned)W;
                const half_bits *src = ok ? x + ((u64)(n * H + gy) * W + gx) * C + cc * 64 + ch * 8 : x;
                cp_async_16(smem_addr(dst + pix * 64 + ((ch ^ (pix & 7)) << 3)), src, ok ? 16 : 0);
            }
        }
    };

    // Patch pixel of tap (0,0) for each A row this lane addresses in ldmatrix.
    int a_pix[MI];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
        const int m = warp_m * WTM + mi * 16 + (lane & 15);
        const int py = m / TW, px = m - py * TW;
        a_pix[mi] = py * PW + px;
    }

    float acc[MI][NI][4];
    warp_mma_zero(acc);

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < num_k) load_stage(s, s);
        cp_async_commit();
    }
    for (int it = 0; it < num_k; ++it) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int next = it + STAGES - 1;
        if (next < num_k) load_stage(next % STAGES, next);
        cp_async_commit();

        const int cc = it / 9, tap = it - cc * 9;
        const int r = tap / 3, s = tap - r * 3;
        const int shift = r * PW + s;
        const half_bits *pA = patch + (cc & 1) * PATCH_HALFS;
        const half_bits *sB = ring + (it % STAGES) * B_HALFS;
        WarpFrags<MI, NI> frags;
        warp_mma_pipelined<MI, NI, BK / 16>(   // warp_mma.cuh
            acc, frags, lane, warp_m, warp_n,
            [&](int mi, int, int ch) {   // A: the patch pixel of this lane's row, shifted by the tap
                const int pix = a_pix[mi] + shift;
                return smem_addr(pA + swz(pix, ch));
            },
            [&](int row, int ch) { return smem_addr(sB + swz(row, ch)); });
    }
    cp_async_wait<0>();

    const int g = lane >> 2, t4 = lane & 3;
    if constexpr (SMEM_EPILOGUE) {
        // Stage acc + bias (fp32) in shared memory (the patch and filter
        // buffers are free now), then each thread finishes 8 channels of one
        // row: 16-byte residual loads and output stores, coalesced along K.
        constexpr int SP = BN + 4;   // fp32 row pitch: a warp's float2 stores spread over all banks
        static_assert(BM * SP * 4 <= patch_smem_bytes(TH, TW, BN, STAGES), "staging fits");
        __syncthreads();
        float *stage = reinterpret_cast<float *>(smem_vec);
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int hr = 0; hr < 2; ++hr)
#pragma unroll
                for (int ni = 0; ni < NI; ++ni) {
                    const int row = warp_m * WTM + mi * 16 + g + hr * 8;
                    const int col = warp_n * WTN + ni * 8 + 2 * t4;
                    float2 v;
                    v.x = acc[mi][ni][hr * 2] + bias[n0 + col];
                    v.y = acc[mi][ni][hr * 2 + 1] + bias[n0 + col + 1];
                    *reinterpret_cast<float2 *>(stage + row * SP + col) = v;
                }
        __syncthreads();
        for (int job = tid; job < BM * (BN / 8); job += THREADS) {
            const int row = job / (BN / 8), c8 = job - row * (BN / 8);
            const int oy = oy0 + row / TW, ox = ox0 + row % TW;
            if (oy >= H || ox >= W) continue;
            const u64 off = (((u64)n * H + oy) * W + ox) * K + n0 + c8 * 8;
            const float4 p0 = *reinterpret_cast<const float4 *>(stage + row * SP + c8 * 8);
            const float4 p1 = *reinterpret_cast<const float4 *>(stage + row * SP + c8 * 8 + 4);
            float v[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
            epilogue_store8(v, off, residual, y, relu);
        }
    } else {
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                const int m = warp_m * WTM + mi * 16 + g + hr * 8;
                const int oy = oy0 + m / TW, ox = ox0 + m % TW;
                if (oy >= H || ox >= W) continue;
                const u64 base = (((u64)n * H + oy) * W + ox) * K;
#pragma unroll
                for (int ni = 0; ni < NI; ++ni) {
                    const int k = n0 + warp_n * WTN + ni * 8 + 2 * t4;
                    epilogue_pair(acc[mi][ni][hr * 2], acc[mi][ni][hr * 2 + 1], k, base + k, bias, residual, y, relu);
                }
            }
        }
    }
}
