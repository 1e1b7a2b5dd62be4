// The stem fused with the 3x3/2 max-pool on Hopper tensor cores (sm_90a): the
// computation of stem.cu's stem_pool_conv7x7s2 (read stem.cu first: the
// normalised input patch, the [64][8 r][24] filter, the pool over the staged
// stem values), with an A operand that is never written to shared memory.
//
// WHY. stem_pool_conv7x7s2 is bound by shared memory (NOTES.md, outcome 2: L1/
// shared 85%, tensor pipe 27%, occupancy 25%). Per tile of 32 pooled pixels it
// builds the im2col A tile (~47 KB of patch reads, 61 KB of writes) and reads
// A and the filter back with ldmatrix for 32 x 32 warp tiles (246 KB): ~13 KB
// of shared-memory traffic per pooled pixel. Here, per tile of 56 pooled
// pixels: A 77 KB, filter 90 KB (both read once per use), patch 8 KB, stem
// values 33 KB + 65 KB for the pool: ~4.9 KB per pooled pixel.
//
// TILING. A block owns SW_PH x SW_PW = 7 x 8 pooled pixels; their windows
// cover 15 x 17 = 255 stem pixels (the overlap row and column are computed by
// both neighbouring blocks), the rows of a 256 x 64 GEMM tile: four m64
// blocks, two per warpgroup, one after the other. For each:
//   - A in registers. wgmma's A fragment (warp w of the warpgroup, lane 4g+t:
//     rows 16w+g and 16w+g+8 of the m64 block, reduction values 2t, 2t+1,
//     2t+8, 2t+9 of each k16 step: warp_mma.cuh's m16n8k16 layout) comes
//     straight from the fp16 patch. With the reduction laid out as in the
//     filter, k = 24r + j (r the filter row, j = 3s + c), value k of stem pixel
//     (ly, lx) is patch element (2ly + r, 6lx + j), and a pair k, k+1 (k even)
//     is one aligned 32-bit word. Pair 8kk + 4h + t of k16 step kk (h = 0 for
//     a0/a1, 1 for a2/a3) lies in filter row (8kk + 4h) / 12 for every t (12
//     pairs per row, a multiple of 4), so its offset is a compile-time constant
//     plus 2t, which goes into the per-thread base: each register is one
//     `ld.shared.b32 [base + imm]`, 42 per m64 block, no address arithmetic.
//   - B from shared memory: the filter as three [64 n][64 k] K-major tiles in
//     the 128-byte swizzle (common.cuh), loaded once per block by cp.async;
//     the descriptor is conv_wgmma.cu's.
//   - K = 7 filter rows x 24 = 168 values in 11 k16 steps: values j = 21..23
//     of each row are zero in the filter (their A values, the next pixel's or
//     the zeroed row ends, are finite), and the upper half of the last step is
//     filter row 7, all zero, whose A registers are 0 (no load).
//   - 11 wgmma.m64n64k16 (A registers, B descriptor), one commit, one wait;
//     then bias + ReLU (0 for stem pixels outside the map), fp16 into the
//     staged stem values.
// After both warpgroups are done, stem.cuh's stem_pool_store writes the 56
// pooled pixels. Blocks are persistent (grid = SMs x SW_BLOCKS_PER_SM, tiles
// blockIdx.x, + gridDim.x, ...) and load the filter and the bias once.
//
// THE uint8 PATCH IS PREFETCHED (UINT8_NHWC, the served input). The next tile's
// raw bytes (35 rows of 39 pixels x 3 bytes, each row as the SW_RAW_ROW / 16
// 16-byte chunks from the one holding its first byte, so any alignment of the
// input works) are copied by cp.async while this tile's wgmma, epilogue and
// pool run; at the top of the tile a shared-memory pass normalises them into
// the fp16 patch (0 outside the image). Global loads at the top of the tile
// (as stem.cu does) leave a warp waiting on them for ~3.5 of the ~11 cycles
// between its instructions (ncu), and the 3-byte pixel loads make 44% of the
// tile loop's instructions (kernels/NOTES.md). FP32_NCHW
// keeps the synchronous stem_load_patch.
//
// SHARED MEMORY. A warp's A load reads the 8 stem pixels g = 0..7 of its rows:
// consecutive pixels of one region row, or wrapping into the next, at words
// ly * SW_IN_ROW + 3lx + t. With SW_IN_ROW = 20 (mod 32) the word after pixel
// lx = 16 of one row continues into the bank of pixel 0 of the next, so the 25
// words are always in different banks. The staged stem values (72 halfs per
// pixel) take the epilogue's 4-byte stores without conflicts as well.

#include "common.cuh"
#include "stem.cuh"
#include "wgmma.cuh"

// SW_PH, SW_PW, SW_M, SW_IN_ROW, SW_RAW_ROW, SW_THREADS, SW_BLOCKS_PER_SM, SP_C_ROW, STEM_*:
// geometry.GEOMETRY.
#define SW_SH (2 * SW_PH + 1)            // 15 stem rows
#define SW_SW (2 * SW_PW + 1)            // 17 stem columns
#define SW_ROWS (SW_SH * SW_SW)          // 255 GEMM rows
#define SW_IN_H (2 * SW_SH + 5)          // 35 patch rows
#define SW_IN_W (2 * SW_SW + 5)          // 39 patch pixels per row
constexpr int SW_KSTEPS = (7 * 24 + 15) / 16;   // 11
constexpr int SW_PATCH_HALFS = (SW_IN_H * SW_IN_ROW + 7) & ~7;   // the stem values after it start 16-byte aligned
constexpr int SW_MB = SW_M / 64 / (SW_THREADS / 128);   // m64 blocks per warpgroup
static_assert(SW_ROWS <= SW_M && SW_M % 64 == 0 && SW_MB == 2, "two m64 blocks per warpgroup");
static_assert(STEM_KG == 192 && STEM_K == 64, "the [64][8 r][24] filter: three [64][64] descriptor tiles");
static_assert(SW_IN_ROW % 2 == 0 && SW_IN_ROW >= 6 * (SW_SW - 1) + 24 && SW_IN_ROW % 32 == 20,
              "patch rows: 32-bit aligned, every A word inside the row, conflict-free A loads");
static_assert(SP_C_ROW >= STEM_K && SP_C_ROW % 8 == 0 && (STEM_K * STEM_KG + SW_PATCH_HALFS) % 8 == 0,
              "staged stem values: 16-byte aligned pixels (the pool's vector loads)");
constexpr int SW_PAIRS = (SW_IN_W + 1) / 2;   // the raw patch is normalised two pixels per job
static_assert(SW_RAW_ROW % 16 == 0 && SW_RAW_ROW >= 15 + 3 * 2 * SW_PAIRS,
              "raw patch rows: whole 16-byte chunks, a row's bytes (and the odd pixel's pair) from any offset");
static_assert(WGMMA_SMEM_ALIGN + (STEM_K * STEM_KG + SW_PATCH_HALFS + SW_M * SP_C_ROW) * 2 + SW_IN_H * SW_RAW_ROW
              + STEM_K * 4 <= STEM_WGMMA_SMEM_BYTES,
              "filter + patch + stem values + raw patch + bias fit the launch's shared memory");

// Issue the cp.async copies of the raw uint8 bytes of the patch of image n from (iy0, ix0): row r
// (input row iy0 + r) as the SW_RAW_ROW / 16 chunks from the 16-byte boundary below its first byte.
// Rows outside the image are not copied (the normalising pass writes 0 there), nor chunks wholly
// outside the input tensor [x, x + x_bytes); a chunk that straddles one of its ends (an input that
// does not start or end on 16 bytes) is copied byte by byte here, its bytes outside left unset.
__device__ __forceinline__ void stem_stage_raw_patch(unsigned char *sRaw, const unsigned char *__restrict__ x,
                                                     u64 x_bytes, int n, int H, int W, int iy0, int ix0, int tid) {
    constexpr int CHUNKS = SW_RAW_ROW / 16;
    const u64 lo = (u64)x, hi = lo + x_bytes;
    for (int i = tid; i < SW_IN_H * CHUNKS; i += SW_THREADS) {
        const int r = i / CHUNKS, c = i - r * CHUNKS;
        const int gy = iy0 + r;
        if ((unsigned)gy >= (unsigned)H) continue;
        const u64 first = lo + (u64)(((long long)(n * H + gy) * W + ix0) * 3);   // ix0 may be < 0
        const u64 chunk = (first & ~(u64)15) + 16 * c;
        if (chunk + 16 <= lo || chunk >= hi) continue;
        unsigned char *dst = sRaw + r * SW_RAW_ROW + 16 * c;
        if (chunk >= lo && chunk + 16 <= hi) {
            cp_async_16(smem_addr(dst), reinterpret_cast<const void *>(chunk), 16);
        } else {
            for (int b = 0; b < 16; ++b)
                if (chunk + b >= lo && chunk + b < hi) dst[b] = *reinterpret_cast<const unsigned char *>(chunk + b);
        }
    }
}

// The staged raw patch (stem_stage_raw_patch, landed and visible) normalised into sIn, two pixels
// per job: byte * scale + shift per channel, fp16, 0 outside the image (the conv's zero padding),
// pixel SW_IN_W (the odd one of the last pair) 0 as well (it lands in the row's zeroed end).
__device__ __forceinline__ void stem_normalise_raw_patch(half_bits *sIn, const unsigned char *sRaw,
                                                         const unsigned char *__restrict__ x, const float (&scale)[3],
                                                         const float (&shift)[3], int n, int H, int W, int iy0,
                                                         int ix0, int tid) {
    for (int i = tid; i < SW_IN_H * SW_PAIRS; i += SW_THREADS) {
        const int r = i / SW_PAIRS, p = 2 * (i - r * SW_PAIRS);
        const int gy = iy0 + r;
        const int off = (int)(((u64)x + (u64)(((long long)(n * H + gy) * W + ix0) * 3)) & 15);
        const unsigned char *src = sRaw + r * SW_RAW_ROW + off + 3 * p;
        float v[6];
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            const int gx = ix0 + p + q;
            const bool inside = (unsigned)gy < (unsigned)H && (unsigned)gx < (unsigned)W && p + q < SW_IN_W;
#pragma unroll
            for (int c = 0; c < 3; ++c) v[3 * q + c] = inside ? (float)src[3 * q + c] * scale[c] + shift[c] : 0.f;
        }
        half2_bits *dst = reinterpret_cast<half2_bits *>(sIn + r * SW_IN_ROW + 3 * p);
        dst[0] = pack_half2(v[0], v[1]);
        dst[1] = pack_half2(v[2], v[3]);
        dst[2] = pack_half2(v[4], v[5]);
    }
}

template <StemInput INPUT>
__global__ void __launch_bounds__(SW_THREADS, SW_BLOCKS_PER_SM)
stem_pool_wgmma(const void *__restrict__ x_, const half_bits *__restrict__ w, const float *__restrict__ bias,
                half_bits *__restrict__ y, const float *__restrict__ in_scale, const float *__restrict__ in_shift,
                int N, int H, int W, int P1, int Q1, int P2, int Q2, int tiles_x, int tiles_per_image,
                int total_tiles) {
    pdl_wait();   // common.cuh: before any global access (the trigger: before the last tile's pool)
    constexpr unsigned int ALIGN_MASK = WGMMA_SMEM_ALIGN - 1;   // descriptor base offset 0
    extern __shared__ vec16 smem_vec[];
    const unsigned int raw = smem_addr(smem_vec);
    half_bits *sB = reinterpret_cast<half_bits *>(reinterpret_cast<unsigned char *>(smem_vec)
                                                  + (((raw + ALIGN_MASK) & ~ALIGN_MASK) - raw));   // [3][64][64]
    half_bits *sIn = sB + STEM_K * STEM_KG;                      // [35][SW_IN_ROW]
    half_bits *sStem = sIn + SW_PATCH_HALFS;                     // [256][SP_C_ROW]
    unsigned char *sRaw = reinterpret_cast<unsigned char *>(sStem + SW_M * SP_C_ROW);   // [35][SW_RAW_ROW] (UINT8_NHWC)
    float *sBias = reinterpret_cast<float *>(sRaw + SW_IN_H * SW_RAW_ROW);               // [64]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warpgroup_index(), warp_in_wg = warp & 3;
    const int g = lane >> 2, t4 = lane & 3;

    // Filter row n, 16-byte chunk c (of 24) -> descriptor tile c / 8, swizzled chunk c % 8.
    for (int i = tid; i < STEM_K * (STEM_KG / 8); i += SW_THREADS) {
        const int row = i / (STEM_KG / 8), c = i - row * (STEM_KG / 8);
        cp_async_16(smem_addr(sB + (c >> 3) * (STEM_K * BK) + swz(row, c & 7)), w + row * STEM_KG + c * 8, 16);
    }
    cp_async_commit();
    if (tid < STEM_K) sBias[tid] = bias[tid];   // visible after the first tile's barrier
    // The ends of the patch rows (no input value lands there) are read by the A loads of values
    // j = 21..23 of the last pixels, with zero filter weights: zero them once (stem_load_patch
    // never writes them), so that they are finite.
    for (int i = tid; i < SW_IN_H * (SW_IN_ROW - 3 * SW_IN_W); i += SW_THREADS) {
        const int r = i / (SW_IN_ROW - 3 * SW_IN_W), v = i - r * (SW_IN_ROW - 3 * SW_IN_W);
        sIn[r * SW_IN_ROW + 3 * SW_IN_W + v] = 0;
    }
    float scale[3] = {1.f, 1.f, 1.f}, shift[3] = {0.f, 0.f, 0.f};
    if (INPUT == StemInput::UINT8_NHWC) {
#pragma unroll
        for (int c = 0; c < 3; ++c) { scale[c] = in_scale[c]; shift[c] = in_shift[c]; }
    }

    // This thread's A rows: stem pixel 64mb + 16w + g (+8) of the region, patch offset of its
    // value pair 0 (rows past the region repeat the last one; their results are dropped).
    int a_base[SW_MB][2];
#pragma unroll
    for (int mbi = 0; mbi < SW_MB; ++mbi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int m = min((wg * SW_MB + mbi) * 64 + warp_in_wg * 16 + g + 8 * h, SW_ROWS - 1);
            const int ly = m / SW_SW, lx = m - ly * SW_SW;
            a_base[mbi][h] = 2 * ly * SW_IN_ROW + 6 * lx + 2 * t4;
        }
    const u64 desc_b = wgmma_desc_sw128(smem_addr(sB));
    const unsigned char *x_u8 = reinterpret_cast<const unsigned char *>(x_);
    const u64 x_bytes = (u64)N * H * W * 3;
    // Tile t: image n, pooled origin (py0, px0), input origin (iy0, ix0) of its patch.
    auto tile_origin = [&](int t, int &n, int &py0, int &px0, int &iy0, int &ix0) {
        n = t / tiles_per_image;
        const int rem = t - n * tiles_per_image;
        const int ty = rem / tiles_x, tx = rem - ty * tiles_x;
        py0 = ty * SW_PH, px0 = tx * SW_PW;
        iy0 = 2 * (2 * py0 - 1) - 3, ix0 = 2 * (2 * px0 - 1) - 3;   // stem origin 2 * pooled - 1
    };
    if (INPUT == StemInput::UINT8_NHWC && blockIdx.x < total_tiles) {   // the first tile's raw patch (UINT8_NHWC)
        int n, py0, px0, iy0, ix0;
        tile_origin(blockIdx.x, n, py0, px0, iy0, ix0);
        stem_stage_raw_patch(sRaw, x_u8, x_bytes, n, H, W, iy0, ix0, tid);
        cp_async_commit();
    }

    for (int t = blockIdx.x; t < total_tiles; t += gridDim.x) {
        int n, py0, px0, iy0, ix0;
        tile_origin(t, n, py0, px0, iy0, ix0);
        const int sy0 = 2 * py0 - 1, sx0 = 2 * px0 - 1;          // stem origin
        // No barrier before the patch: every thread's A loads of the previous tile were done
        // before the barrier ahead of its pool, and the pool reads only the stem values.
        if constexpr (INPUT == StemInput::UINT8_NHWC) {
            cp_async_wait<0>();            // the filter (first tile) and this tile's raw patch
            fence_proxy_async_shared();    // ... the filter visible to wgmma's async-proxy reads
            __syncthreads();               // ... and every thread's copies to all
            stem_normalise_raw_patch(sIn, sRaw, x_u8, scale, shift, n, H, W, iy0, ix0, tid);
            __syncthreads();               // the patch complete, the raw buffer free
            if (t + gridDim.x < total_tiles) {   // the next tile's raw patch lands during this tile
                int n1, py1, px1, iy1, ix1;
                tile_origin(t + gridDim.x, n1, py1, px1, iy1, ix1);
                stem_stage_raw_patch(sRaw, x_u8, x_bytes, n1, H, W, iy1, ix1, tid);
            }
            cp_async_commit();
        } else {
            stem_load_patch<INPUT, SW_IN_H, SW_IN_W, SW_IN_ROW, SW_THREADS, true>(sIn, x_, scale, shift, n, H, W, iy0,
                                                                            ix0, tid);
            cp_async_wait<0>();            // the filter (first tile)
            fence_proxy_async_shared();    // ... the filter visible to wgmma's async-proxy reads
            __syncthreads();
        }

#pragma unroll
        for (int mbi = 0; mbi < SW_MB; ++mbi) {
            unsigned int a[SW_KSTEPS][4];
#pragma unroll
            for (int kk = 0; kk < SW_KSTEPS; ++kk)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    constexpr int PAIRS_PER_ROW = 24 / 2;
                    const int p0 = 8 * kk + 4 * h;
                    if (p0 >= 7 * PAIRS_PER_ROW) {   // filter row 7: zero weights
                        a[kk][2 * h] = a[kk][2 * h + 1] = 0u;
                        continue;
                    }
                    const int off = (p0 / PAIRS_PER_ROW) * SW_IN_ROW + 2 * (p0 % PAIRS_PER_ROW);
                    a[kk][2 * h] = *reinterpret_cast<const unsigned int *>(sIn + a_base[mbi][0] + off);
                    a[kk][2 * h + 1] = *reinterpret_cast<const unsigned int *>(sIn + a_base[mbi][1] + off);
                }
            float acc[32];
#pragma unroll
            for (int j = 0; j < 32; ++j) acc[j] = 0.f;
            wgmma_fence_operands<32>(acc);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < SW_KSTEPS; ++kk)   // tile kk / 4, 32 bytes per k16 step (16-byte descriptor units)
                wgmma_m64n64k16_rs(acc, a[kk], desc_b + (kk >> 2) * (STEM_K * BK * 2 / 16) + (kk & 3) * 2);
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_fence_operands<32>(acc);

            // Accumulator layout: conv_wgmma.cu (d[4j..4j+3]: the m16n8 fragment of columns 8j..8j+7).
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int m = (wg * SW_MB + mbi) * 64 + warp_in_wg * 16 + g + 8 * h;
                if (m >= SW_ROWS) continue;
                const int ly = m / SW_SW, lx = m - ly * SW_SW;
                const bool inside = (unsigned)(sy0 + ly) < (unsigned)P1 && (unsigned)(sx0 + lx) < (unsigned)Q1;
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    const int k = 8 * j + 2 * t4;
                    float v0 = 0.f, v1 = 0.f;
                    if (inside) {
                        v0 = fmaxf(acc[4 * j + 2 * h] + sBias[k], 0.f);
                        v1 = fmaxf(acc[4 * j + 2 * h + 1] + sBias[k + 1], 0.f);
                    }
                    *reinterpret_cast<half2_bits *>(sStem + m * SP_C_ROW + k) = pack_half2(v0, v1);
                }
            }
        }
        __syncthreads();
        if (t + (int)gridDim.x >= total_tiles) pdl_trigger();   // common.cuh: this block's last tile
        stem_pool_store<SW_PH, SW_PW, SP_C_ROW, SW_THREADS>(y, sStem, tid, n, py0, px0, P2, Q2);
    }
    cp_async_wait<0>();   // a block without a tile: its filter copies
}
