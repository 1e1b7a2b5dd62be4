// 3x3 / stride 1 / pad 1 convolution with 64 input channels (ResNet-18's
// layer1) on Hopper tensor cores (sm_90a): wgmma with BOTH operands straight
// from shared memory, the input patch loaded once per tile and the filter once
// per block.
//
// WHY. conv_wgmma.cu builds an im2col A tile per k-tile: each input pixel is
// fetched from L2 nine times (once per tap), and with K = 64 output channels
// the tile has 64 MACs per byte loaded: layer1 ran at 30-36% of the
// tensor-core peak (NOTES.md). conv3x3_patch.cu (mma.sync) loads the patch
// once, but hands each lane an ldmatrix address per tap, which a shared-memory
// descriptor cannot express for a 2-D tile.
//
// THE FLAT PADDED GRID. Number the positions of the zero-padded input,
// (N, H+2, W+2), row-major: q = (n*(H+2) + py)*(W+2) + px. Output pixel
// (n, oy, ox) is computed at position o = (n*(H+2) + oy)*(W+2) + ox, and its
// input for tap (r, s) is padded pixel (oy+r, ox+s), position
// o + r*(W+2) + s: for every tap, a run of consecutive output positions reads
// a run of consecutive patch rows, shifted by r*(W+2) + s. So the A operand of
// tap (r, s) for the m64 block of positions o .. o+63 is 64 consecutive
// 128-byte rows of the patch: one wgmma shared-memory descriptor whose start
// address is the shifted row. Positions with oy >= H or ox >= W (the two pad
// columns of each row, the two pad rows of each image: (H+2)(W+2)/(HW) - 1 =
// 7% extra work at 56x56) are computed and dropped by the epilogue.
//
// TILING. A block owns BN = 64 output channels (blockIdx.y) and walks tiles
// of BM consecutive positions (tile blockIdx.x, + gridDim.x, ...: persistent
// blocks). Its shared memory holds
//   the filter slice   9 taps x [64 channels][64] = 72 KB, loaded once;
//   STAGES patches     rows q0 .. q0 + BM + 2(W+2) + 1 of the flat padded
//                      input (rounded up to whole 8-row atoms), zeros where
//                      the position is padding or past the last image.
// Warpgroup g of WGS owns positions g*BM/WGS ... of the tile in MB m64
// blocks; per tile it issues 9 taps x 4 k16 steps x MB wgmma.m64n64k16, one
// commit group, no barrier in between.
//
// DESCRIPTORS. Patch row j and filter row n are common.cuh's swizzled
// 128-byte rows (16-byte chunk c at c ^ (row & 7)), every buffer starting on
// a 1024-byte boundary: the 128B-swizzle layout of conv_wgmma.cu with the
// same descriptor fields (wgmma.cuh), base offset 0, even though an A operand
// starts at any row, not only on an 8-row atom. The hardware applies the XOR
// to the bits of each row's absolute shared-memory address, as for the
// 32-byte k16 steps inside a row. Measured on the H100 (NOTES.md, outcome
// 15): base offset 0 is exact; the PTX ISA's "(start address >> 7) & 7" for
// a start off the pattern boundary gave garbage (relative L2 0.6-1.0).
//
// PIPELINE (tile i of this block, patch stage i % STAGES, prefetch distance
// STAGES-2, two accumulator sets so that a tile's wgmma overlap the previous
// tile's epilogue):
//   cp.async.wait_group; fence.proxy.async; __syncthreads   patch i landed,
//                         and every warpgroup is past tile i-2's wgmma
//   zero acc; wgmma.fence; 36*MB wgmma on patch i; commit
//   cp.async the patch of tile i+STAGES-2 into the stage tile i-2 used
//   wgmma.wait_group 1    tile i-1's wgmma are done ...
//   epilogue of tile i-1 from the other accumulator set  ... while tile i's run
//   output rows and residual loads of tile i (registers; used by its epilogue
//                         one tile later)
// The loop is written so that one commit group, into the same set, is in
// flight on every path into its header (the code says why).
// The epilogue is epilogue.cuh's (bias from registers, residual, ReLU, fp16
// NHWC), rows at padding positions dropped; its residual loads are issued a
// tile ahead (epilogue_load_residual_rows / epilogue_store_rows).
//
// VEC (the "v1" / "v2" tiles). A fragment holds 4 bytes of a row per column
// group (channels 8j + 2t, +1), so each 4-byte store of a warp writes 16
// bytes to each of 8 rows: a row's 128 bytes take 8 requests. With VEC the
// quad's 4 lanes trade their words first (common.cuh quad_transpose4, 4
// shuffles per 4 words) so that each lane stores 16 contiguous bytes
// (channels 8t .. 8t+7, then 8(t+4) ..): 2 requests per row. VEC 1: stores
// only (layer1 at batch 128 on the H100: -7% with the residual, -9% without,
// NOTES.md outcome 43); VEC 2: the residual loads as well, turned back before
// the fp32 sum (the fastest at batch 8 and 32).

#include "common.cuh"
#include "epilogue.cuh"
#include "wgmma.cuh"

constexpr int PATCH_TAPS = 9;   // the 3x3 filter's taps: k-tiles of the reduction, one per tap (C = BK)

template <int BM, int WGS, int STAGES, int VEC>
__global__ void __launch_bounds__(WGS * 128, 1)
conv3x3_patch_wgmma(const half_bits *__restrict__ x, const half_bits *__restrict__ w, const float *__restrict__ bias,
                    const half_bits *__restrict__ residual, half_bits *__restrict__ y,
                    int N, int H, int W, int K, int num_tiles, int relu) {
    // common.cuh: the 9-tap slice of this block's channels into L2, no trigger (before the last epilogue),
    // no wait yet: the filter copies and the index arithmetic below read nothing another kernel writes.
    pdl_begin_prefetch_filter_slice(w, blockIdx.y * PATCH_WGMMA_BN, PATCH_WGMMA_BN, K, PATCH_TAPS * BK, 0, PATCH_TAPS,
                                    blockIdx.x == 0, false, false);
    constexpr int BN = PATCH_WGMMA_BN;        // output channels per block (and the input channels: BK)
    constexpr int THREADS = WGS * 128;
    constexpr int WM = BM / WGS;              // positions per warpgroup
    constexpr int MB = WM / 64;               // m64 blocks per warpgroup
    constexpr int NACC = BN / 2;              // fp32 accumulators per thread per m64 block
    constexpr int FILTER_HALFS = PATCH_TAPS * BN * BK;
    static_assert(BN == BK && WM % 64 == 0 && MB >= 1 && STAGES >= 3, "tile shape");
    static_assert(VEC >= 0 && VEC <= 2 && BN == 64, "VEC: 4-byte fragments (0), 16-byte stores (1), and loads (2)");
    static_assert((BN * PATCH_TAPS * 8) % THREADS == 0, "filter loader mapping");

    extern __shared__ vec16 smem_vec[];
    constexpr unsigned int ALIGN_MASK = WGMMA_SMEM_ALIGN - 1;
    const unsigned int raw = smem_addr(smem_vec);
    half_bits *filter = reinterpret_cast<half_bits *>(reinterpret_cast<unsigned char *>(smem_vec)
                                                      + (((raw + ALIGN_MASK) & ~ALIGN_MASK) - raw));
    const int pw = W + 2, plane = (H + 2) * pw;
    const int patch_rows = patch_wgmma_rows(BM, W);                 // a multiple of 8: stages stay 1024-aligned
    half_bits *patches = filter + FILTER_HALFS;                      // [STAGES][patch_rows][64]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warpgroup_index(), warp_in_wg = warp & 3;
    const int g = lane >> 2, t4 = lane & 3;
    const int n0 = blockIdx.y * BN;
    const int chunk = tid & 7;
    const int my_tiles = (int)blockIdx.x < num_tiles ? (num_tiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;

    // The filter slice: B tile of tap t = rows n0 .. n0+63 of w[K][9*64], halfs t*64 .. t*64+63.
#pragma unroll 4
    for (int i = tid; i < BN * PATCH_TAPS * 8; i += THREADS) {
        const int n = i / (PATCH_TAPS * 8), tc = i - n * (PATCH_TAPS * 8);   // tc = tap * 8 + chunk: global order
        const int tap = tc >> 3;
        cp_async_16(smem_addr(filter + tap * BN * BK + swz(n, tc & 7)), w + (u64)(n0 + n) * (PATCH_TAPS * BK) + tc * 8,
                    16);
    }

    // Positions to (image, row, column) of the padded grid: common.cuh's fast_divmod. Integer
    // division sequences would be 70 of the ~85 instructions per patch row (SASS, kernels/NOTES.md),
    // and a tile's patch is ~12 rows per thread.
    const fast_divmod by_plane(plane), by_pw(pw);

    // The patch of the tile starting at position q0: row j = position q0 + j, zeros at padding. Pixel
    // indices are 32-bit (N*H*W < 2^31: layer1's maps), the byte offset 64-bit.
    auto load_patch = [&](int stage, int tile) {
        half_bits *dst = patches + stage * patch_rows * BK;
        const int q0 = tile * BM;
        for (int row = tid >> 3; row < patch_rows; row += THREADS / 8) {
            int rem, px;
            const int img = by_plane.divmod(rem, q0 + row);
            const int py = by_pw.divmod(px, rem);
            const bool inside = img < N && (unsigned)(py - 1) < (unsigned)H && (unsigned)(px - 1) < (unsigned)W;
            const int pixel = inside ? (img * H + py - 1) * W + px - 1 : 0;
            cp_async_16(smem_addr(dst + swz(row, chunk)), x + (u64)pixel * BK + chunk * 8, inside ? 16 : 0);
        }
    };

    const int first = blockIdx.x, step = gridDim.x;
    pdl_wait();   // common.cuh: from here on the earlier kernels' outputs (x, residual) are visible
#pragma unroll
    for (int s = 0; s < STAGES - 2; ++s) {   // the filter joins the first group
        if (s < my_tiles) load_patch(s, first + s * step);
        cp_async_commit();
    }

    // This thread's bias values: columns n0 + 8j + 2*t4 (+1), the same for every tile.
    float bias_lo[BN / 8], bias_hi[BN / 8];
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        bias_lo[j] = bias[n0 + j * 8 + 2 * t4];
        bias_hi[j] = bias[n0 + j * 8 + 2 * t4 + 1];
    }

    const unsigned int filter_addr = smem_addr(filter);

    // Tile i of this block: 9 taps x 4 k16 steps x MB m64 blocks into acc, one commit group.
    auto mma_tile = [&](float (&acc)[MB][NACC], int i) {
        const unsigned int rows = smem_addr(patches + (i % STAGES) * patch_rows * BK) + wg * WM * BK * 2;
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) {
#pragma unroll
            for (int j = 0; j < NACC; ++j) acc[mb][j] = 0.f;
            wgmma_fence_operands<NACC>(acc[mb]);
        }
        // Each descriptor is a base plus its offset (bytes / 16, in the start-address field: every address
        // is below 256 KB, no carry out of it). The filter's base goes through an opaque move, once per tile:
        // else ptxas hoists the 36 loop-invariant filter descriptors out of the tile loop and holds them in
        // 72 registers (206 -> 146 registers per thread at pwg128g2s4, ptxas 13.0; 3- and 4-warpgroup
        // tiles spilled with them under their 168- and 128-register caps: NOTES.md, outcome 39).
        u64 filter_desc = wgmma_desc_sw128(filter_addr);
        asm volatile("mov.b64 %0, %0;" : "+l"(filter_desc));
        const u64 rows_desc = wgmma_desc_sw128(rows);
        wgmma_fence();
#pragma unroll
        for (int tap = 0; tap < PATCH_TAPS; ++tap) {
            const int shift = (tap / 3) * pw + tap % 3;             // patch rows: tap (r, s) reads o + r*(W+2) + s
            const u64 desc_b = filter_desc + ((tap * BN * BK * 2) >> 4);
#pragma unroll
            for (int kk = 0; kk < BK / 16; ++kk) {
#pragma unroll
                for (int mb = 0; mb < MB; ++mb) {
                    const u64 desc_a = rows_desc + (((mb * 64 + shift) * BK * 2) >> 4);
                    wgmma_m64k16<BN>(acc[mb], desc_a + 2 * kk, desc_b + 2 * kk);   // k16 step: 32 bytes on
                }
            }
        }
        wgmma_commit();
    };

    // This thread's output rows of a tile (per m64 block, fragment rows g and g+8: y's element offset of
    // channel 0, false at padding positions) and their residual values. With one m64 block per warpgroup
    // they are fetched ONE TILE AHEAD, right after the previous tile's epilogue: the residual of a large
    // batch comes from HBM, and loaded in the epilogue its latency (~1 us under load) stood between a
    // tile's epilogue and the next tile's wgmma (NOTES.md, outcome 31). With two m64 blocks the 32 more
    // registers spill (ptxas 13.0: 224-232 bytes of stack), so those tiles fetch block by block in the
    // epilogue.
    constexpr bool ROWS_AHEAD = MB == 1;
    u64 out_row[MB][2];
    bool out_valid[MB][2];
    half2_bits res[MB][2][BN / 8];
    const int k0 = n0 + 2 * t4;
    const bool add_residual = residual != nullptr;
    auto fetch_block_rows = [&](int tile, int mb) {
#pragma unroll
        for (int half_row = 0; half_row < 2; ++half_row) {
            const int o = tile * BM + wg * WM + mb * 64 + warp_in_wg * 16 + g + half_row * 8;
            int rem, ox;
            const int img = by_plane.divmod(rem, o);
            const int oy = by_pw.divmod(ox, rem);
            out_valid[mb][half_row] = img < N && oy < H && ox < W;
            out_row[mb][half_row] = ((u64)(img * H + oy) * W + ox) * K;
        }
        if constexpr (VEC == 2) {   // 16 bytes per row and load: channels 8*t4 .. (words 0-3), 8*(t4+4) .. (4-7)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int part = 0; part < 2; ++part) {
                    vec16 v = {0u, 0u, 0u, 0u};
                    if (add_residual && out_valid[mb][h])
                        v = *reinterpret_cast<const vec16 *>(residual + out_row[mb][h] + n0 + 8 * (t4 + 4 * part));
                    res[mb][h][4 * part] = v.x; res[mb][h][4 * part + 1] = v.y;
                    res[mb][h][4 * part + 2] = v.z; res[mb][h][4 * part + 3] = v.w;
                }
        } else {
            epilogue_load_residual_rows<BN / 8>(res[mb], out_row[mb], out_valid[mb], k0, K, residual);
        }
    };
    auto fetch_rows = [&](int tile) {
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) fetch_block_rows(tile, mb);
    };

    // The epilogue of tile `tile` from acc (wgmma accumulator layout: conv_wgmma.cu's header), its rows
    // fetched before (ROWS_AHEAD) or here; the block's channels n0 .. n0+63 never cross K (no check).
    const auto bias_pair = [&](int j) { return float_pair(bias_lo[j], bias_hi[j]); };
    // VEC: each row's 8 fragment words (channels 8j + 2*t4, +1) through quad_transpose4 to 16 contiguous
    // bytes per lane and store (channels 8*t4 .. and 8*(t4+4) ..): 4 stores of 16 bytes per thread and m64 block
    // instead of 16 of 4, each row's 128 bytes in 2 requests instead of 8. VEC == 2: the residual came in
    // that layout and is turned back the same way.
    auto epilogue_vec = [&](const float (&acc)[NACC], half2_bits (&r)[2][BN / 8], const u64 (&row)[2],
                            const bool (&valid)[2]) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            if constexpr (VEC == 2) {
#pragma unroll
                for (int part = 0; part < 2; ++part) {
                    unsigned int q[4] = {r[h][4 * part], r[h][4 * part + 1], r[h][4 * part + 2], r[h][4 * part + 3]};
                    quad_transpose4(q, t4);
#pragma unroll
                    for (int c = 0; c < 4; ++c) r[h][4 * part + c] = q[c];
                }
            }
            unsigned int words[BN / 8];
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
                float v0 = acc[4 * j + 2 * h] + bias_lo[j], v1 = acc[4 * j + 2 * h + 1] + bias_hi[j];
                if (add_residual) {
                    float r0, r1;
                    unpack_half2(r[h][j], r0, r1);
                    v0 += r0; v1 += r1;
                }
                if (relu) { v0 = fmaxf(v0, 0.f); v1 = fmaxf(v1, 0.f); }
                words[j] = pack_half2(v0, v1);
            }
#pragma unroll
            for (int part = 0; part < 2; ++part)
                epilogue_store16(words + 4 * part, t4, y + row[h] + n0 + 32 * part, valid[h]);
        }
    };
    auto epilogue = [&](const float (&acc)[MB][NACC], int tile) {
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) {
            if constexpr (!ROWS_AHEAD) fetch_block_rows(tile, mb);
            if constexpr (VEC > 0)
                epilogue_vec(acc[mb], res[mb], out_row[mb], out_valid[mb]);
            else if (add_residual)
                epilogue_store_rows<BN / 8, true, false>(acc[mb], bias_pair, res[mb], out_row[mb], out_valid[mb], k0,
                                                         K, y, relu);
            else
                epilogue_store_rows<BN / 8, false, false>(acc[mb], bias_pair, res[mb], out_row[mb], out_valid[mb],
                                                          k0, K, y, relu);
        }
    };

    // Tile i: wait for its patch, issue its wgmma into acc, refill the stage of tile i-2 (done: every
    // warpgroup is past tile i-2's wgmma).
    auto start_tile = [&](float (&acc)[MB][NACC], int i) {
        cp_async_wait<STAGES - 3>();
        fence_proxy_async_shared();
        __syncthreads();
        fence_proxy_async_shared();
        mma_tile(acc, i);
        const int next = i + STAGES - 2;   // after the wgmma are issued: the loads' arithmetic runs under them
        if (next < my_tiles) load_patch(next % STAGES, first + next * step);
        cp_async_commit();
    };
    // Tile i's wgmma done (the one group issued after them may run on): its epilogue from acc, then the
    // rows of tile i + 1 (whose wgmma are in flight).
    auto finish_tile = [&](float (&acc)[MB][NACC], int i) {
        wgmma_wait<1>();
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) wgmma_fence_operands<NACC>(acc[mb]);
        epilogue(acc, first + i * step);
        if constexpr (ROWS_AHEAD) fetch_rows(first + (i + 1) * step);
    };
    auto finish_last_tile = [&](float (&acc)[MB][NACC], int i) {
        wgmma_wait<0>();
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) wgmma_fence_operands<NACC>(acc[mb]);
        epilogue(acc, first + i * step);
    };

    // Tiles alternate between two accumulator sets. The loop starts and ends each pass with one commit
    // group in flight, into acc1: ptxas serialises the wgmma (C7514) unless every path into the loop
    // header has the same accumulators in flight.
    float acc0[MB][NACC], acc1[MB][NACC];
    if (my_tiles == 0) return;
    if constexpr (ROWS_AHEAD) fetch_rows(first);   // tile 0's residual loads run under its patch loads and wgmma
    start_tile(acc1, 0);
    int i = 1;
    for (; i + 1 < my_tiles; i += 2) {
        start_tile(acc0, i);
        finish_tile(acc1, i - 1);
        start_tile(acc1, i + 1);
        finish_tile(acc0, i);
    }
    if (i < my_tiles) {   // one tile left
        start_tile(acc0, i);
        finish_tile(acc1, i - 1);
        pdl_trigger();   // common.cuh: the next kernel launches during the last epilogue
        finish_last_tile(acc0, i);
    } else {
        pdl_trigger();
        finish_last_tile(acc1, i - 1);
    }
    cp_async_wait<0>();
}
