// The stem: 7x7/2 convolution, pad 3, 3 -> 64 channels, + folded-BatchNorm
// bias + ReLU, from UINT8 NHWC pixels (StemInput::UINT8_NHWC, ImageNet normalisation fused)
// or fp32 NCHW normalised values (FP32_NCHW). fp16 NHWC out.
//
// Why not the generic implicit GEMM: with C=3 the im2col row of an output
// pixel is 147 scattered values, and gathering them from global memory per
// k-tile costs more than the tensor-core work (v1/v2: 1.18 / 0.61 ms at batch
// 128, 50 TFLOP/s). Here a block owns an 8 x 16 tile of output pixels of one
// image (the 128 rows of its GEMM tile) and:
//   1. loads the input patch the tile reads, (2*8+5) x (2*16+5) pixels x 3
//      channels, once, normalises it (x*in_scale[c] + in_shift[c], in_scale =
//      1/(255 std), in_shift = -mean/std: zero padding outside the image is
//      zero in normalised space, as in PyTorch) and keeps it in shared memory
//      as fp16;
//   2. builds the whole A tile (128 rows x 192 reduction values) in shared
//      memory from that patch (stem_build_a);
//   3. multiplies it with the filter, stored [64][8 rows r][24 = 7 s x 3 c + 3
//      zeros] (row 7 all zero: 192 values, so that for a fixed output pixel
//      and r the 21 values are contiguous in the NHWC patch) and loaded once
//      per block by cp.async, with mma.sync m16n8k16 (8 warps, 4 x 2, 32 x 32
//      each; warp_mma.cuh);
//   4. adds the bias, applies ReLU and stores fp16.
// A block loops over `tiles_per_block` consecutive tiles, reusing the filter.
// Steps 2-3 and the filter load are device functions shared with the fused
// stem + max-pool kernel below (stem_build_a, stem_mma_32x32,
// stem_load_filter); step 1 (stem_load_patch) and the pool are stem.cuh's,
// shared with stem_wgmma.cu as well.

#include "common.cuh"
#include "stem.cuh"
#include "warp_mma.cuh"

// STEM_TH, STEM_TW, STEM_KG, STEM_K, STEM_IN_ROW, STEM_THREADS and the SP_*
// sizes below come from geometry.GEOMETRY (pasted before this file).
#define STEM_IN_H (2 * STEM_TH + 5)     // 21
#define STEM_IN_W (2 * STEM_TW + 5)     // 37
static_assert(STEM_IN_W * 3 <= STEM_IN_ROW && STEM_IN_ROW % 2 == 0, "patch rows: whole pixels, 32-bit aligned");
static_assert(STEM_TH * STEM_TW == 128 && STEM_THREADS == 256, "8 warps of 32 x 32 over a 128 x 64 tile");
static_assert(((STEM_TH * STEM_TW + STEM_K) * STEM_KG + STEM_IN_H * STEM_IN_ROW) * 2 <= STEM_SMEM_BYTES,
              "sA + sB + sIn fit the launch's shared memory");

// Offset (halfs) of 16-byte chunk `chunk` of row `row` in a [rows][192] tile:
// the low 3 bits of the chunk index are XORed with the row, so the 8 rows an
// ldmatrix phase reads land in 8 different bank groups.
__device__ __forceinline__ int stem_swz(int row, int chunk) {
    return row * STEM_KG + (((chunk & ~7) | ((chunk ^ row) & 7)) << 3);
}

// The [64][192] filter into sB (swizzled), by cp.async; committed by the caller.
template <int THREADS>
__device__ __forceinline__ void stem_load_filter(half_bits *sB, const half_bits *__restrict__ w, int tid) {
    for (int i = tid; i < STEM_K * (STEM_KG / 8); i += THREADS) {
        const int row = i / (STEM_KG / 8), ch = i - row * (STEM_KG / 8);
        cp_async_16(smem_addr(sB + stem_swz(row, ch)), w + row * STEM_KG + ch * 8, 16);
    }
}

// Step 2: the A tile ([ROWS][192], swizzled by stem_swz) from the patch. GEMM
// row `row` is output pixel (row / OUT_W, row % OUT_W) of the tile, and for
// filter row r its 21 values (s, c) are input pixels 2*px .. 2*px+6 of patch
// row 2*py + r: 21 contiguous halfs starting at an even index, copied as 10
// aligned 32-bit words + one half into three 16-byte chunks (zero-padded to
// 24 values; filter row 7 and rows >= VALID_ROWS all zero). The loop runs
// over (r, row) pairs r-major, so with ROWS a multiple of 32 r is warp-uniform.
// c0, c1, c2 are the caller's, declared in its tile loop (as WarpFrags in
// warp_mma.cuh: allocas of a force-inlined helper reorder the PHIs and change
// the register allocation); the expression order below is the one the two
// kernels' own copies of this loop compiled to (kernels/sass_diff.py).
__host__ __device__ constexpr int stem_log2(int v) { return v > 1 ? 1 + stem_log2(v / 2) : 0; }

template <int ROWS, int VALID_ROWS, int OUT_W, int IN_ROW, int THREADS>
__device__ __forceinline__ void stem_build_a(half_bits *sA, const half_bits *sIn, int tid, vec16 &c0, vec16 &c1,
                                             vec16 &c2) {
    static_assert(ROWS % 32 == 0 && VALID_ROWS <= ROWS, "whole warps per filter row");
    for (int i = tid; i < 8 * ROWS; i += THREADS) {
        int r, row;
        if constexpr ((ROWS & (ROWS - 1)) == 0) {   // shifts: the compiler cannot prove i >= 0
            r = i >> stem_log2(ROWS); row = i & (ROWS - 1);
        } else {
            r = i / ROWS; row = i - r * ROWS;
        }
        if (r < 7 && row < VALID_ROWS) {
            const int py = row / OUT_W;
            const int in_row = 2 * py + r, px = row - py * OUT_W;
            const unsigned int *src = reinterpret_cast<const unsigned int *>(sIn + in_row * IN_ROW + 2 * px * 3);
            c0.x = src[0]; c0.y = src[1]; c0.z = src[2]; c0.w = src[3];
            c1.x = src[4]; c1.y = src[5]; c1.z = src[6]; c1.w = src[7];
            c2.x = src[8]; c2.y = src[9]; c2.z = src[10] & 0xffffu; c2.w = 0u;
        } else {
            c0.x = c0.y = c0.z = c0.w = 0u; c1 = c0; c2 = c0;
        }
        *reinterpret_cast<vec16 *>(sA + stem_swz(row, r * 3 + 0)) = c0;
        *reinterpret_cast<vec16 *>(sA + stem_swz(row, r * 3 + 1)) = c1;
        *reinterpret_cast<vec16 *>(sA + stem_swz(row, r * 3 + 2)) = c2;
    }
}

// One warp's 32 x 32 x 192 product on tensor cores (warp_mma.cuh): rows
// warp_m*32 .. +31 of sA ([rows][192]) times filter rows warp_n*32 .. +31 of
// sB ([64][192]), both swizzled by stem_swz; acc zeroed first.
__device__ __forceinline__ void stem_mma_32x32(float (&acc)[2][4][4], const half_bits *sA, const half_bits *sB,
                                               int warp_m, int warp_n, int lane) {
    warp_mma_zero(acc);
    warp_mma<2, 4, STEM_KG / 16>(acc, lane, warp_m, warp_n,
                                 [&](int, int row, int ch) { return smem_addr(sA + stem_swz(row, ch)); },
                                 [&](int row, int ch) { return smem_addr(sB + stem_swz(row, ch)); });
}

template <StemInput INPUT>
__global__ void __launch_bounds__(STEM_THREADS, 2)
stem_conv7x7s2(const void *__restrict__ x_, const half_bits *__restrict__ w, const float *__restrict__ bias,
               half_bits *__restrict__ y, const float *__restrict__ in_scale, const float *__restrict__ in_shift,
               int N, int H, int W, int P, int Q, int tiles_x, int tiles_per_image, int total_tiles,
               int tiles_per_block) {
    pdl_begin();   // common.cuh: before any global access
    extern __shared__ vec16 smem_vec[];
    half_bits *sA = reinterpret_cast<half_bits *>(smem_vec);     // [128][192]
    half_bits *sB = sA + 128 * STEM_KG;                          // [64][192]
    half_bits *sIn = sB + STEM_K * STEM_KG;                      // [21][112]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int warp_m = warp >> 1, warp_n = warp & 1;

    stem_load_filter<STEM_THREADS>(sB, w, tid);
    cp_async_commit();
    float scale[3] = {1.f, 1.f, 1.f}, shift[3] = {0.f, 0.f, 0.f};
    if (INPUT == StemInput::UINT8_NHWC) {
#pragma unroll
        for (int c = 0; c < 3; ++c) { scale[c] = in_scale[c]; shift[c] = in_shift[c]; }
    }

    const int t_begin = blockIdx.x * tiles_per_block;
    const int t_end = min(total_tiles, t_begin + tiles_per_block);
    for (int t = t_begin; t < t_end; ++t) {
        const int n = t / tiles_per_image, rem = t - n * tiles_per_image;
        const int ty = rem / tiles_x, tx = rem - ty * tiles_x;
        const int oy0 = ty * STEM_TH, ox0 = tx * STEM_TW;
        const int iy0 = oy0 * 2 - 3, ix0 = ox0 * 2 - 3;
        __syncthreads();   // the previous tile is done with sIn and sA

        // 1. normalised fp16 input patch
        stem_load_patch<INPUT, STEM_IN_H, STEM_IN_W, STEM_IN_ROW, STEM_THREADS>(sIn, x_, scale, shift, n, H, W, iy0, ix0, tid);
        __syncthreads();

        // 2. A tile
        vec16 c0, c1, c2;
        stem_build_a<STEM_TH * STEM_TW, STEM_TH * STEM_TW, STEM_TW, STEM_IN_ROW, STEM_THREADS>(sA, sIn, tid, c0, c1,
                                                                                                c2);
        cp_async_wait<0>();
        __syncthreads();

        // 3. 128 x 64 x 192 on tensor cores
        float acc[2][4][4];
        stem_mma_32x32(acc, sA, sB, warp_m, warp_n, lane);

        // 4. bias + ReLU, fp16 NHWC
        const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                const int row = warp_m * 32 + mi * 16 + g + hr * 8;
                const int oy = oy0 + row / STEM_TW, ox = ox0 + row % STEM_TW;
                if (oy >= P || ox >= Q) continue;
                half_bits *dst = y + (((u64)n * P + oy) * Q + ox) * STEM_K;
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) {
                    const int k = warp_n * 32 + ni * 8 + 2 * t4;
                    const float v0 = fmaxf(acc[mi][ni][hr * 2] + bias[k], 0.f);
                    const float v1 = fmaxf(acc[mi][ni][hr * 2 + 1] + bias[k + 1], 0.f);
                    *reinterpret_cast<half2_bits *>(dst + k) = pack_half2(v0, v1);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The stem fused with the 3x3/2 max-pool (pad 1): the 64-channel 112x112 stem
// output never goes to global memory. A block owns a 4 x 8 tile of POOLED
// pixels; their windows cover a 9 x 17 region of stem pixels (the overlap row
// and column are computed by both neighbouring blocks: 153 stem pixels per 32
// pooled ones instead of 128). The region is a GEMM tile of 153 rows (padded
// to 160 = 5 warps x 32) x 64 channels x 192 reduction values, built exactly as
// in stem_conv7x7s2 from a 23 x 39-pixel input patch. After bias + ReLU the
// fp16 stem values go to shared memory (over the A tile; rows padded to 72
// halfs so the half2 stores of a warp spread over the banks), with stem
// pixels outside the image set to 0, and stem.cuh's stem_pool_store pools
// them (256 threads, 8 channels of one pooled pixel each). On sm_90a the
// wgmma and mixed paths run stem_wgmma.cu's stem_pool_wgmma instead.

// SP_PH x SP_PW pooled pixels, SP_M GEMM rows, SP_IN_ROW, SP_C_ROW and
// STEM_POOL_THREADS: geometry.GEOMETRY.
#define SP_SH (2 * SP_PH + 1)            // 9 stem rows
#define SP_SW (2 * SP_PW + 1)            // 17 stem cols
#define SP_ROWS (SP_SH * SP_SW)          // 153 GEMM rows
#define SP_IN_H (2 * SP_SH + 5)          // 23
#define SP_IN_W (2 * SP_SW + 5)          // 39
static_assert(SP_ROWS <= SP_M && SP_M % 32 == 0 && STEM_POOL_THREADS == SP_M / 32 * 2 * 32, "5 x 2 warps of 32 x 32");
static_assert(SP_IN_W * 3 <= SP_IN_ROW && SP_IN_ROW % 2 == 0 && SP_C_ROW >= STEM_K, "patch and staging rows");
static_assert(SP_PH * SP_PW * 8 <= STEM_POOL_THREADS, "one thread per 8 channels of a pooled pixel");
static_assert(((SP_M + STEM_K) * STEM_KG + SP_IN_H * SP_IN_ROW) * 2 <= STEM_POOL_SMEM_BYTES
              && SP_ROWS * SP_C_ROW <= SP_M * STEM_KG, "sA + sB + sIn fit; the stem values fit over sA");

template <StemInput INPUT>
__global__ void __launch_bounds__(STEM_POOL_THREADS, 2)
stem_pool_conv7x7s2(const void *__restrict__ x_, const half_bits *__restrict__ w, const float *__restrict__ bias,
                    half_bits *__restrict__ y, const float *__restrict__ in_scale, const float *__restrict__ in_shift,
                    int N, int H, int W, int P1, int Q1, int P2, int Q2, int tiles_x, int tiles_per_image,
                    int total_tiles, int tiles_per_block) {
    pdl_begin();   // common.cuh: before any global access
    extern __shared__ vec16 smem_vec[];
    half_bits *sA = reinterpret_cast<half_bits *>(smem_vec);     // [160][192], later [153][72] stem values
    half_bits *sB = sA + SP_M * STEM_KG;                         // [64][192]
    half_bits *sIn = sB + STEM_K * STEM_KG;                      // [23][118]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int warp_m = warp >> 1, warp_n = warp & 1;             // 5 x 2 warps, 32 x 32 each

    stem_load_filter<STEM_POOL_THREADS>(sB, w, tid);
    cp_async_commit();
    float scale[3] = {1.f, 1.f, 1.f}, shift[3] = {0.f, 0.f, 0.f};
    if (INPUT == StemInput::UINT8_NHWC) {
#pragma unroll
        for (int c = 0; c < 3; ++c) { scale[c] = in_scale[c]; shift[c] = in_shift[c]; }
    }

    const int t_begin = blockIdx.x * tiles_per_block;
    const int t_end = min(total_tiles, t_begin + tiles_per_block);
    for (int t = t_begin; t < t_end; ++t) {
        const int n = t / tiles_per_image, rem = t - n * tiles_per_image;
        const int ty = rem / tiles_x, tx = rem - ty * tiles_x;
        const int py0 = ty * SP_PH, px0 = tx * SP_PW;            // pooled origin
        const int sy0 = 2 * py0 - 1, sx0 = 2 * px0 - 1;          // stem origin
        const int iy0 = 2 * sy0 - 3, ix0 = 2 * sx0 - 3;          // input origin
        __syncthreads();   // the previous tile is done with sIn and sA

        stem_load_patch<INPUT, SP_IN_H, SP_IN_W, SP_IN_ROW, STEM_POOL_THREADS>(sIn, x_, scale, shift, n, H, W, iy0, ix0, tid);
        __syncthreads();

        vec16 c0, c1, c2;
        stem_build_a<SP_M, SP_ROWS, SP_SW, SP_IN_ROW, STEM_POOL_THREADS>(sA, sIn, tid, c0, c1, c2);
        cp_async_wait<0>();
        __syncthreads();

        float acc[2][4][4];
        stem_mma_32x32(acc, sA, sB, warp_m, warp_n, lane);
        __syncthreads();   // every warp is done reading sA: it becomes the stem-value buffer

        const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                const int row = warp_m * 32 + mi * 16 + g + hr * 8;
                if (row >= SP_ROWS) continue;
                const int ly = row / SP_SW, lx = row - ly * SP_SW;
                const bool inside = (unsigned)(sy0 + ly) < (unsigned)P1 && (unsigned)(sx0 + lx) < (unsigned)Q1;
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) {
                    const int k = warp_n * 32 + ni * 8 + 2 * t4;
                    float v0 = 0.f, v1 = 0.f;
                    if (inside) {
                        v0 = fmaxf(acc[mi][ni][hr * 2] + bias[k], 0.f);
                        v1 = fmaxf(acc[mi][ni][hr * 2 + 1] + bias[k + 1], 0.f);
                    }
                    *reinterpret_cast<half2_bits *>(sA + row * SP_C_ROW + k) = pack_half2(v0, v1);
                }
            }
        }
        __syncthreads();

        stem_pool_store<SP_PH, SP_PW, SP_C_ROW, STEM_POOL_THREADS>(y, sA, tid, n, py0, px0, P2, Q2);
    }
}
