// Convolution as implicit GEMM on Hopper tensor cores (sm_90a): wgmma.mma_async
// with shared-memory matrix descriptors, the same loaders (loaders.cuh) and
// epilogue (epilogue.cuh) as conv_implicit_gemm.cu (read that file's header
// first: implicit GEMM, the swizzled 128-byte tile rows and split-K are
// explained there).
//
// WHY. On the H100 the mma.sync kernels issue one m16n8k16 per 4096 MACs plus
// the ldmatrix loads that feed it, from every warp: measured 26-37% of the
// tensor-core peak on the 3x3 convs, bound by instruction issue and by the
// fixed-latency mma chain (NOTES.md, outcomes 3 and 4). One wgmma
// m64nNk16 does 64*N*16 MACs (131072 at N=128) for a whole warpgroup and reads
// both operands straight from shared memory: no ldmatrix, no fragments.
//
// TILING. A block of WGS warpgroups (128 threads each) computes a BM x BN tile
// of D = A * B^T. Warpgroup g owns rows [g*BM/WGS, (g+1)*BM/WGS) of the tile
// and all BN columns, in MB = BM/WGS/64 m64 blocks of BN/2 fp32 accumulators
// per thread. The reduction runs over k-tiles of BK = 64 (one filter tap,
// 64 input channels) through a STAGES-deep ring of [BM][64] A and [BN][64] B
// tiles in shared memory, filled by every thread with loaders.cuh's cp.async
// loaders, as in conv_implicit_gemm.cu. Each k-tile is 4 k16 steps: per step
// and m64 block one wgmma.mma_async.m64nBNk16 (A and B both K-major from
// shared memory, fp16 in, fp32 accumulate).
//
// DESCRIPTORS. The tiles are common.cuh's swizzled 128-byte rows, so each
// group of 8 rows is one 1024-byte 128B-swizzle atom: descriptor swizzle
// mode 1 (128B), stride-dimension byte offset 1024 (the next 8 rows),
// leading-dimension byte offset 16 (unused for K-major swizzled operands whose
// k16 slice lies inside one 128-byte row), base offset 0 (every m64 block and
// B tile starts on a 1024-byte boundary: the ring is aligned at run time). The
// k16 step kk starts 32*kk bytes into the row: the start address advances by
// 32 bytes and the hardware applies the XOR to the absolute address bits,
// which is how the rows were stored.
//
// PIPELINE (one k-tile i per iteration; cp.async ring with prefetch distance
// STAGES-2, so that one k-tile of wgmma can stay in flight):
//   cp.async.wait_group   tile i has landed (this thread's copies)
//   fence.proxy.async     ... and is ordered before async-proxy (wgmma) reads
//   __syncthreads         every thread's copies of tile i are done; every
//                         warpgroup has retired the wgmma of tile i-2
//   cp.async tile i+STAGES-2 into the stage tile i-2 used
//   wgmma.fence; 4*MB wgmma.mma_async on stage i; wgmma.commit_group
//   wgmma.wait_group 1    the wgmma of tile i-1 are done (tile i may run on)
// After the loop wgmma.wait_group 0, then the epilogue.
// With three stages the distance is 2 instead (AHEAD in the code): the refill
// goes into the stage of tile i-1 and each k-tile ends with wgmma.wait_group
// 0, trading the wgmma overlap for one more tile in flight. Measured on the
// H100 (NOTES.md outcome 30): the 3-stage tiles 4-14% faster that way, the 4-
// and 6-stage tiles 11-25% slower.
//
// FUSED SHORTCUT. k-tiles from main_k_tiles on (to num_k_tiles) are a
// downsampling block's 1x1 projection of shortcut_x (loaders.cuh explains it);
// without one, main_k_tiles == num_k_tiles. Only the instantiations with
// INPUT = ConvInput::FP16_NHWC_FUSED_SHORTCUT have the second loader: a run-time branch in every tile's
// k-loop cost 5-13% at batch 8 (NOTES.md outcome 22). conv_wgmma_ws
// takes the same arguments and has none (its 256x128 producer spilled with
// the second loader, and its tiles were never chosen: NOTES.md outcome 11).
//
// EPILOGUE. The wgmma accumulator layout per warp is the mma.sync m16n8 one
// (epilogue.cuh) repeated over the BN/8 column groups: warp w of the
// warpgroup holds rows 16w .. 16w+15 of its m64 block, and d[4j..4j+3] is the
// m16n8 fragment of columns 8j .. 8j+7. The epilogue is epilogue.cuh's.
//
// Versions (measurements in NOTES.md):
//   v1  cp.async ring + wgmma from shared-memory descriptors, all threads load
//       and compute (no warp specialisation, no TMA, no mbarriers).
//   v2  conv_wgmma_ws (kernels/dev/conv_wgmma_ws.cu: never chosen, not served): a producer warpgroup issues
//       the cp.async loads, the consumer warpgroups only wgmma and the
//       epilogue, per-stage full / empty mbarriers instead of a __syncthreads
//       per k-tile (tiles.py: the "ws" tiles).
//   v3  Schedule::CLUSTER_SPLIT_K (tiles.py: the "wc" tiles): the gridDim.z split-K
//       slices of a tile are one thread-block cluster (launched with cluster
//       dims (1, 1, splits)); each stages its fp32 partial tile over its
//       drained ring, and after a cluster barrier each block adds a share of
//       the tile across all slices through distributed shared memory and
//       applies the epilogue (wgmma_cluster_splitk_epilogue). The main loop is
//       the plain kernel's; the workspace and the splitk_epilogue kernel (one
//       more launch per split convolution) are gone.
//   v4  Schedule::PERSISTENT (tiles.py: the "wp" tiles): blocks_per_sm blocks per SM run
//       tile after tile with one ring (conv_wgmma_persistent_tiles, below).
//   v6  conv_wgmma_tma (at the end of this file; tiles.py: the "wt" tiles): the
//       persistent walk with every operand tile loaded by the TMA, issued by
//       one producer thread on conv_wgmma_ws's mbarrier ring (Schedule::TMA_WARP_SPECIALIZED); Schedule::TMA_PINGPONG
//       ("wq" tiles): the two consumer warpgroups take whole tiles in turn.

#include "common.cuh"
#include "epilogue.cuh"
#include "loaders.cuh"
#include "wgmma.cuh"

// Shared by conv_wgmma and conv_wgmma_ws (each inlined where it stood before
// it was shared: kernels/sass_diff.py shows conv_wgmma's code unchanged).

// The dynamic shared memory, advanced to the next WGMMA_SMEM_ALIGN (1024-byte)
// boundary: descriptors with base offset 0 (the launch allocates
// WGMMA_SMEM_ALIGN bytes more than the ring).
__device__ __forceinline__ half_bits *wgmma_aligned_smem(vec16 *smem_vec) {
    constexpr unsigned int ALIGN_MASK = WGMMA_SMEM_ALIGN - 1;
    const unsigned int raw = smem_addr(smem_vec);
    return reinterpret_cast<half_bits *>(reinterpret_cast<unsigned char *>(smem_vec)
                                         + (((raw + ALIGN_MASK) & ~ALIGN_MASK) - raw));
}

// One k-tile of warpgroup wg (rows wg*WM ...): the 4 k16 steps of its MB m64
// blocks on the stage whose A tile starts at shared byte address sA and B tile
// at sB, as one wgmma commit group.
template <int BN, int MB, int WM>
__device__ __forceinline__ void wgmma_ktile(float (&acc)[MB][BN / 2], unsigned int sA, unsigned int sB, int wg) {
    const u64 desc_b = wgmma_desc_sw128(sB);
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) wgmma_fence_operands<BN / 2>(acc[mb]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) {
            const u64 desc_a = wgmma_desc_sw128(sA + (wg * WM + mb * 64) * BK * 2);
            // k16 step kk: 32 bytes further into each row (descriptor units of 16 bytes).
            wgmma_m64k16<BN>(acc[mb], desc_a + 2 * kk, desc_b + 2 * kk);
        }
    }
    wgmma_commit();
}

// The epilogue straight from the accumulators (layout in the header) of
// warpgroup wg's rows of the BM x BN tile at (m0, n0). BATCHED (without split-K): epilogue.cuh's
// epilogue_rows, the residual loads of both fragment rows first; else pair by pair. Measured on the
// H100 (2026-11-23 02:22 UTC, each conv alone): batched, the tiles with one m64 block per warpgroup and
// BN <= 128 ran 3-11% faster (layer2's 128x128 at batch 128 -8 to -10%, with or without a residual),
// the 128x256 and the one-warpgroup 128x128 tiles 3-28% slower (more registers, one block per SM).
//
// VEC (the "v" tiles of conv_wgmma_tma; K % 32 == 0, no split-K): as conv3x3_patch_wgmma's VEC 1, each row's
// fragment words go through common.cuh's quad_transpose4 and each lane stores 16 contiguous bytes (4 words
// of 4 column groups: channels 32b + 8*t4 .. +7), a row's 64 bytes of a 32-channel block in one request
// instead of 4; the residual loads of both fragment rows are issued first where BATCHED, else row by row.
template <int BN, int MB, int WM, bool BATCHED = (MB == 1 && BN <= 128), bool VEC = false>
__device__ __forceinline__ void wgmma_epilogue(const float (&acc)[MB][BN / 2], int m0, int n0, int wg, int warp_in_wg,
                                               int lane, int M, int K, const float *__restrict__ bias,
                                               const half_bits *__restrict__ residual, half_bits *__restrict__ y,
                                               float *__restrict__ partial, int relu) {
    const int g = lane >> 2, t4 = lane & 3;
    // m64 block mb's fragment rows g and g+8: y's element offset of channel 0, and m < M
    const auto fragment_rows = [&](int mb, u64 (&row)[2], bool (&valid)[2]) {
#pragma unroll
        for (int half_row = 0; half_row < 2; ++half_row) {
            const int m = m0 + wg * WM + mb * 64 + warp_in_wg * 16 + g + half_row * 8;
            valid[half_row] = m < M;
            row[half_row] = (u64)m * K;
        }
    };
    if (VEC && partial == nullptr && (K & 31) == 0) {
        static_assert(!VEC || BN % 32 == 0, "VEC: whole 32-channel blocks");
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) {
            u64 row[2];
            bool valid[2];
            fragment_rows(mb, row, valid);
            const int k0 = n0 + 2 * t4;
            half2_bits res[2][BN / 8];
            if constexpr (BATCHED) epilogue_load_residual_rows<BN / 8>(res, row, valid, k0, K, residual);
#pragma unroll
            for (int half_row = 0; half_row < 2; ++half_row) {
                if constexpr (!BATCHED) {   // row by row: the ping-pong tiles hold 128 accumulators per thread
#pragma unroll
                    for (int j = 0; j < BN / 8; ++j)
                        res[half_row][j] = residual != nullptr && valid[half_row] && k0 + 8 * j < K
                            ? *reinterpret_cast<const half2_bits *>(residual + row[half_row] + k0 + 8 * j) : 0u;
                }
                unsigned int words[BN / 8];
#pragma unroll
                for (int j = 0; j < BN / 8; ++j) {
                    const int k = k0 + 8 * j;
                    float v0 = acc[mb][4 * j + 2 * half_row], v1 = acc[mb][4 * j + 2 * half_row + 1];
                    if (k < K) { v0 += bias[k]; v1 += bias[k + 1]; }
                    float r0, r1;
                    unpack_half2(res[half_row][j], r0, r1);   // zeros without a residual
                    v0 += r0; v1 += r1;
                    if (relu) { v0 = fmaxf(v0, 0.f); v1 = fmaxf(v1, 0.f); }
                    words[j] = pack_half2(v0, v1);
                }
#pragma unroll
                for (int b = 0; b < BN / 32; ++b)
                    if (n0 + 32 * b < K)   // the same for the whole warp
                        epilogue_store16(words + 4 * b, t4, y + row[half_row] + n0 + 32 * b, valid[half_row]);
            }
        }
        return;
    }
    if (BATCHED && partial == nullptr) {
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) {
            u64 row[2];
            bool valid[2];
            fragment_rows(mb, row, valid);
            const int k0 = n0 + 2 * t4;
            epilogue_rows<BN / 8>(
                acc[mb], [&](int j) { return float_pair(bias[k0 + 8 * j], bias[k0 + 8 * j + 1]); }, row, valid, k0, K,
                residual, y, relu);
        }
        return;
    }
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) {
#pragma unroll
        for (int half_row = 0; half_row < 2; ++half_row) {
            const int m = m0 + wg * WM + mb * 64 + warp_in_wg * 16 + g + half_row * 8;
            if (m >= M) continue;
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
                const int k = n0 + j * 8 + 2 * t4;
                if (k >= K) continue;
                epilogue_pair_or_partial(acc[mb][4 * j + half_row * 2], acc[mb][4 * j + half_row * 2 + 1], k,
                                         (u64)m * K + k, M, K, bias, residual, y, partial, relu);
            }
        }
    }
}


// Blocks per SM the launch bounds ask registers for: two wherever two rings fit in an SM's shared memory
// (wgmma_launch_blocks, geometry.SMEM_BYTES), else one.
__host__ __device__ constexpr int wgmma_min_blocks(int bm, int bn, int stages) {
    return wgmma_launch_blocks(wgmma_smem_bytes(bm, bn, stages));
}

// The split-K slices of one tile, a cluster of gridDim.z blocks (CLUSTER_SPLITK), added up through
// distributed shared memory. Each block stages its fp32 partial tile ([BM][BN + CLUSTER_STAGE_PAD] over
// its ring, which every warpgroup has drained: the wgmma_wait<0> and cp_async_wait<0> before the
// barrier), then after a cluster barrier block `rank` reduces items rank, rank + slices, ... of
// the tile's BM x BN/8 groups of 8 channels (slices in order 0, 1, ...: the sum splitk_epilogue forms)
// and stores them with epilogue.cuh's epilogue_store8_loaded. The last cluster barrier keeps every
// block's shared memory alive until the others have read it.
template <int BM, int BN, int MB, int WM, int THREADS>
__device__ __forceinline__ void wgmma_cluster_splitk_epilogue(const float (&acc)[MB][BN / 2], half_bits *smem,
                                                              int m0, int n0, int wg, int warp_in_wg, int lane,
                                                              int tid, int M, int K, const float *__restrict__ bias,
                                                              const half_bits *__restrict__ residual,
                                                              half_bits *__restrict__ y, int relu) {
    constexpr int LD = BN + CLUSTER_STAGE_PAD;   // floats per staged row: a half-warp's 4 rows in distinct banks
    constexpr int GROUPS = BN / 8;
    float *stage = reinterpret_cast<float *>(smem);
    const int g = lane >> 2, t4 = lane & 3;
    __syncthreads();   // every warpgroup is past its last wgmma and copies: the ring is free
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
        for (int half_row = 0; half_row < 2; ++half_row) {
            const int row = wg * WM + mb * 64 + warp_in_wg * 16 + g + half_row * 8;
#pragma unroll
            for (int j = 0; j < BN / 8; ++j)
                *reinterpret_cast<float2 *>(stage + row * LD + 8 * j + 2 * t4)
                    = float_pair(acc[mb][4 * j + half_row * 2], acc[mb][4 * j + half_row * 2 + 1]);
        }
    // An item's bias and residual (zeros without one) are loaded before its slices are read, and the first
    // item's before the cluster barrier (they depend on no other block): their latency (L2) runs under
    // the barrier and the distributed-shared-memory reads instead of after them.
    const int slices = (int)cluster_num_blocks(), rank = (int)cluster_block_rank();
    const int first_item = rank * THREADS + tid;
    vec16 b0 = {0u, 0u, 0u, 0u}, b1 = b0, res = b0;   // bias values as bits (common.cuh's early load)
    auto item_operands = [&](int m, int k) {   // output row m, channels k .. k+7 (inside M x K)
        b0 = ld_global_nc_16_early(bias + k);
        b1 = ld_global_nc_16_early(bias + k + 4);
        if (residual != nullptr) res = ld_global_nc_16_early(residual + (u64)m * K + k);
    };
    {
        const int row = first_item / GROUPS, group = first_item - row * GROUPS;
        if (first_item < BM * GROUPS && m0 + row < M && n0 + 8 * group < K) item_operands(m0 + row, n0 + 8 * group);
    }
    cluster_sync();   // every slice of the tile staged and visible to the cluster
    const unsigned int stage_addr = smem_addr(stage);
    for (int item = first_item; item < BM * GROUPS; item += slices * THREADS) {
        const int row = item / GROUPS, group = item - row * GROUPS;
        const int m = m0 + row, k = n0 + 8 * group;
        if (m >= M || k >= K) continue;
        if (item != first_item) item_operands(m, k);
        float v[8] = {__uint_as_float(b0.x), __uint_as_float(b0.y), __uint_as_float(b0.z), __uint_as_float(b0.w),
                      __uint_as_float(b1.x), __uint_as_float(b1.y), __uint_as_float(b1.z), __uint_as_float(b1.w)};
        const unsigned int local = stage_addr + (row * LD + 8 * group) * 4;
        for (int s = 0; s < slices; ++s) {
            const unsigned int remote = cluster_map_shared(local, s);
            const float4 lo = ld_shared_cluster_f4(remote), hi = ld_shared_cluster_f4(remote + 16);
            v[0] += lo.x; v[1] += lo.y; v[2] += lo.z; v[3] += lo.w;
            v[4] += hi.x; v[5] += hi.y; v[6] += hi.z; v[7] += hi.w;
        }
        epilogue_store8_loaded(v, res, residual != nullptr, (u64)m * K + k, y, relu);
    }
    cluster_sync();   // no block exits while its staged slice may still be read
}

// One k-tile of conv_wgmma's cp.async ring (header, PIPELINE): wait for k-tile i's copies, make them
// visible to the wgmma (fence, barrier, fence), `refill` the stage AHEAD k-tiles on (it commits one
// cp.async group, empty or not), then the k-tile's wgmma and the wait the prefetch distance allows.
template <int BM, int BN, int MB, int WM, int STAGES, int AHEAD, class Refill>
__device__ __forceinline__ void wgmma_ring_ktile(float (&acc)[MB][BN / 2], half_bits *smem, int i, int wg,
                                                 Refill &&refill) {
    constexpr int A_HALFS = BM * BK, STAGE_HALFS = (BM + BN) * BK;
    cp_async_wait<AHEAD - 1>();   // k-tile i landed: all but the newest AHEAD - 1 groups are complete
    fence_proxy_async_shared();
    __syncthreads();
    fence_proxy_async_shared();
    refill();   // into the stage of k-tile i - (STAGES - AHEAD), whose wgmma are done
    const unsigned int sA = smem_addr(smem + (i % STAGES) * STAGE_HALFS);
    wgmma_ktile<BN, MB, WM>(acc, sA, sA + A_HALFS * 2, wg);
    if constexpr (AHEAD == STAGES - 1) wgmma_wait<0>();
    else wgmma_wait<1>();
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) wgmma_fence_operands<BN / 2>(acc[mb]);
}

// PERSISTENT (tiles.py: the "wp" tiles): gridDim.x blocks, at most blocks_per_sm per SM, run the tiles
// t = blockIdx.x, + gridDim.x, ... of the M x K output (t -> output channels (t % n_tiles) * BN, rows
// (t / n_tiles) * BM: neighbouring blocks share their A rows), each over all num_k_tiles (no split-K).
// The k-loop runs on across tiles: the ring's global k-tile counter i picks the stage, and the loader,
// AHEAD k-tiles in front, moves to the block's next tile (its igemm_a_rows state, set_loader_rows) while
// the last k-tiles of the current one still run. So the next tile's first k-tiles are in flight during
// the epilogue, which reads only registers and global memory (the ring stays the loader's), and a tile
// starts without the prologue and the ring fill a non-persistent block pays: with K = 9 x 64 (layer2.0's
// stride-2 conv) those are about a third of a 128x128 tile's time (NOTES.md outcome 32).
template <int BM, int BN, int MB, int WM, int STAGES, int AHEAD, class LoadTile, class SetLoaderRows>
__device__ __forceinline__ void conv_wgmma_persistent_tiles(float (&acc)[MB][BN / 2], half_bits *smem,
                                                            LoadTile &load_tile_at, SetLoaderRows set_loader_rows,
                                                            int wg, int warp_in_wg, int lane, int M, int K,
                                                            int num_k_tiles, const float *__restrict__ bias,
                                                            const half_bits *__restrict__ residual,
                                                            half_bits *__restrict__ y, int relu) {
    const int n_tiles = (K + BN - 1) / BN, tiles = ((M + BM - 1) / BM) * n_tiles;
    // The loader's position: tile load_t, its k-tile load_kt, its output channels load_n0. (The caller
    // has waited for the previous kernel: pdl_wait.)
    int load_t = blockIdx.x, load_kt = 0, load_n0 = (load_t % n_tiles) * BN;
    set_loader_rows((load_t / n_tiles) * BM);
    auto load_next = [&](int stage) {   // the loader's k-tile into `stage` (nothing past the last tile), then on
        if (load_t < tiles) load_tile_at(stage, load_kt, load_n0);
        cp_async_commit();
        if (++load_kt == num_k_tiles) {
            load_kt = 0;
            load_t += gridDim.x;
            if (load_t < tiles) {
                load_n0 = (load_t % n_tiles) * BN;
                set_loader_rows((load_t / n_tiles) * BM);
            }
        }
    };
#pragma unroll
    for (int s = 0; s < AHEAD; ++s) load_next(s);
    int i = 0;   // the ring's k-tile counter, across tiles
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        for (int kt = 0; kt < num_k_tiles; ++kt, ++i)
            wgmma_ring_ktile<BM, BN, MB, WM, STAGES, AHEAD>(acc, smem, i, wg,
                                                            [&] { load_next((i + AHEAD) % STAGES); });
        wgmma_wait<0>();
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) wgmma_fence_operands<BN / 2>(acc[mb]);
        if (t + (int)gridDim.x >= tiles) pdl_trigger();   // the block's last tile: the next kernel may launch
        wgmma_epilogue<BN, MB, WM>(acc, (t / n_tiles) * BM, (t % n_tiles) * BN, wg, warp_in_wg, lane, M, K, bias,
                                   residual, y, nullptr, relu);
#pragma unroll
        for (int mb = 0; mb < MB; ++mb)
#pragma unroll
            for (int j = 0; j < BN / 2; ++j) acc[mb][j] = 0.f;
    }
    cp_async_wait<0>();   // only empty groups remain: no copy outlives the block
}

template <int BM, int BN, int WGS, int STAGES, Schedule SCHEDULE = Schedule::MULTISTAGE,
          ConvInput INPUT = ConvInput::FP16_NHWC>
__global__ void __launch_bounds__(WGS * 128, wgmma_min_blocks(BM, BN, STAGES))
conv_wgmma(const half_bits *__restrict__ x, const half_bits *__restrict__ w, const float *__restrict__ bias,
           const half_bits *__restrict__ residual, half_bits *__restrict__ y, float *__restrict__ partial,
           int N, int H, int W, int C, int K, int P, int Q, int R, int S, int stride, int pad,
           int ldw, int num_k_tiles, int k_tiles_per_split, int relu, const half_bits *__restrict__ shortcut_x,
           int shortcut_h, int shortcut_w, int shortcut_c, int shortcut_stride, int main_k_tiles) {
    // common.cuh: the filter slice into L2, no trigger (after the main loop) and no wait yet: the index
    // arithmetic below reads no memory another kernel writes, so it overlaps the kernel before this one.
    // (PERSISTENT: grid (blocks, 1, 1), k_tiles_per_split = num_k_tiles, and every block may run every
    // output-channel tile, so the slice is the whole filter: bn = K.)
    pdl_begin_prefetch_filter(w, SCHEDULE == Schedule::PERSISTENT ? K : BN, K, ldw, num_k_tiles, k_tiles_per_split,
                              false, false);
    static_assert(SCHEDULE == Schedule::MULTISTAGE || SCHEDULE == Schedule::CLUSTER_SPLIT_K
                  || SCHEDULE == Schedule::PERSISTENT, "conv_wgmma's schedules (the TMA ones: conv_wgmma_tma)");
    constexpr bool CLUSTER_SPLITK = SCHEDULE == Schedule::CLUSTER_SPLIT_K, PERSISTENT = SCHEDULE == Schedule::PERSISTENT;
    static_assert(INPUT == ConvInput::FP16_NHWC || INPUT == ConvInput::FP16_NHWC_FUSED_SHORTCUT,
                  "conv_wgmma's inputs (fp16 NHWC activations; the stem has its own kernels)");
    constexpr bool SHORTCUT = INPUT == ConvInput::FP16_NHWC_FUSED_SHORTCUT;
    constexpr int THREADS = WGS * 128;
    constexpr int WM = BM / WGS;              // rows per warpgroup
    constexpr int MB = WM / 64;               // m64 blocks per warpgroup
    constexpr int NACC = BN / 2;              // fp32 accumulators per thread per m64 block
    static_assert(WM % 64 == 0 && MB >= 1, "each warpgroup owns whole m64 blocks");
    static_assert(STAGES >= 3, "prefetch distance STAGES-2 >= 1");
    static_assert((BM * 8) % THREADS == 0 && (BN * 8) % THREADS == 0, "loader mapping");
    constexpr int A_ITERS = BM * 8 / THREADS, B_ITERS = BN * 8 / THREADS;
    constexpr int ROW_STEP = THREADS / 8;
    constexpr int A_HALFS = BM * BK, STAGE_HALFS = (BM + BN) * BK;   // multiples of 512 halfs = 1024 bytes

    // The ring must start on a 1024-byte boundary (base offset 0 in the
    // descriptors); the launch allocates WGMMA_SMEM_ALIGN bytes more than the ring.
    static_assert(WGMMA_SMEM_ALIGN == 1024 && STAGES * STAGE_HALFS * 2 + WGMMA_SMEM_ALIGN
                  <= wgmma_smem_bytes(BM, BN, STAGES), "smem layout");
    extern __shared__ vec16 smem_vec[];
    half_bits *smem = wgmma_aligned_smem(smem_vec);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warpgroup_index(), warp_in_wg = warp & 3;
    const int M = N * P * Q;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    const int kt_begin = blockIdx.z * k_tiles_per_split;
    const int kt_end = min(num_k_tiles, kt_begin + k_tiles_per_split);
    const int nkt = kt_end - kt_begin;

    // Loader state and loaders: loaders.cuh, as in conv_implicit_gemm.cu (FP16_NHWC).
    const int chunk = tid & 7;
    int a_base[A_ITERS], a_ih[A_ITERS], a_iw[A_ITERS];
    igemm_a_rows<A_ITERS, ROW_STEP>(a_base, a_ih, a_iw, m0, tid, M, H, W, C, P, Q, stride, pad);
    const fast_divmod by_ctiles(C / BK), by_s(S);   // k-tile -> tap, channels (loaders.cuh)

    auto load_tile_at = [&](int stage, int kt, int tile_n0) {
        half_bits *sA = smem + stage * STAGE_HALFS;
        half_bits *sB = sA + A_HALFS;
        igemm_load_b<B_ITERS, ROW_STEP>(sB, w, tile_n0, K, ldw, kt, tid, chunk);
        if (!SHORTCUT || kt < main_k_tiles)
            igemm_load_a<A_ITERS, ROW_STEP>(sA, x, a_base, a_ih, a_iw, kt, by_ctiles, by_s, H, W, C, tid, chunk);
        else if constexpr (SHORTCUT)   // the fused shortcut's k-tiles (loaders.cuh)
            igemm_load_a_shortcut<A_ITERS, ROW_STEP>(sA, shortcut_x, a_base, a_ih, a_iw, kt - main_k_tiles,
                                                     1.f / (H * W * C), pad, shortcut_h, shortcut_w, shortcut_c,
                                                     shortcut_stride, tid, chunk);
    };
    auto load_tile = [&](int stage, int kt) {   // the block's own tile (not PERSISTENT)
        load_tile_at(stage, kt, n0);
    };

    float acc[MB][NACC];
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
        for (int j = 0; j < NACC; ++j) acc[mb][j] = 0.f;

    // Prefetch distance (header, PIPELINE): 2 with three stages (tile i-1's wgmma retired before k-tile
    // i, only tile i's in flight across the refill); else STAGES - 2 (tiles i-1 and i in flight).
    constexpr int AHEAD = STAGES == 3 ? STAGES - 1 : STAGES - 2;
    if constexpr (PERSISTENT) {
        pdl_wait();   // common.cuh: from here on the earlier kernels' outputs (x, residual) are visible
        conv_wgmma_persistent_tiles<BM, BN, MB, WM, STAGES, AHEAD>(
            acc, smem, load_tile_at, [&](int tile_m0) {
                igemm_a_rows<A_ITERS, ROW_STEP>(a_base, a_ih, a_iw, tile_m0, tid, M, H, W, C, P, Q, stride, pad);
            },
            wg, warp_in_wg, lane, M, K, num_k_tiles, bias, residual, y, relu);
        return;
    }
    pdl_wait();   // common.cuh: from here on the earlier kernels' outputs (x, shortcut_x, residual) are visible
#pragma unroll
    for (int s = 0; s < AHEAD; ++s) {
        if (s < nkt) load_tile(s, kt_begin + s);
        cp_async_commit();
    }

    for (int i = 0; i < nkt; ++i)
        wgmma_ring_ktile<BM, BN, MB, WM, STAGES, AHEAD>(acc, smem, i, wg, [&] {
            const int next = i + AHEAD;
            if (next < nkt) load_tile(next % STAGES, kt_begin + next);
            cp_async_commit();
        });
    wgmma_wait<0>();
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) wgmma_fence_operands<NACC>(acc[mb]);
    cp_async_wait<0>();
    pdl_trigger();   // common.cuh: the next kernel launches while the epilogues run

    if constexpr (CLUSTER_SPLITK) {
        static_assert(cluster_stage_bytes(BM, BN) <= STAGES * STAGE_HALFS * 2, "the staged tile fits the ring");
        wgmma_cluster_splitk_epilogue<BM, BN, MB, WM, THREADS>(acc, smem, m0, n0, wg, warp_in_wg, lane, tid, M, K,
                                                               bias, residual, y, relu);
    } else {
        wgmma_epilogue<BN, MB, WM>(acc, m0, n0, wg, warp_in_wg, lane, M, K, bias, residual, y, partial, relu);
    }
}


// ---- v6: TMA loads (conv_wgmma_tma) -------------------------------------------
//
// The persistent tile walk of the "wp" tiles and conv_wgmma_ws's full / empty mbarrier ring (kernels/dev), with
// every operand tile loaded by the TMA (wgmma.cuh) instead of cp.async from every thread (tiles.py:
// the "wt" tiles). Why: layer2.0.conv1 (stride 2, 9 k-tiles per tile) waits on its operand loads
// (NOTES.md outcomes 33 and 34), and each k-tile of a 128x128 block was 2048 16-byte cp.async with
// their im2col address arithmetic, spread over all its threads.
//   warpgroups 0 .. WGS-1  consumers: rows as in conv_wgmma, wgmma and the epilogue only;
//   warp 4 * WGS           producer, one thread: per k-tile one im2col load of the BM x 64 A tile
//                          (tap (r, s) as the im2col offsets, 64 channels from c0) and one tiled load
//                          of the BN x 64 filter tile, both onto full[stage] with their byte count.
// Tiles t = blockIdx.x, + gridDim.x, ... as the "wp" tiles; the producer runs up to STAGES k-tiles
// ahead of the consumers' releases, across tiles, so the next tile's loads are in flight during
// the epilogue. full[s]: count 1 (the producer's arrive.expect_tx; the TMA's bytes complete the
// phase); empty[s]: count 4 * WGS (lane 0 of each consumer warp, once its wgmma of the stage are
// done: wait_group 1 after the next k-tile's wgmma, as conv_wgmma_ws). The A tile of the tile at
// output row m0 = (image n, row p, column q) starts where that position's filter window does,
// (q * stride - pad, p * stride - pad): the tensor map's element strides and bounding box (the
// launcher) make the walk the implicit GEMM's rows in order; rows past M read zeros and are not
// stored. No fused shortcut, no split-K. Tensor maps: kernels/launch.py (tma_maps).
// Schedule::TMA_PINGPONG (PINGPONG; tiles.py: the "wq" tiles; CUTLASS's "ping-pong" kernel schedule): each consumer warpgroup
// owns whole BM x BN tiles, warpgroup g the block's tiles j = g, g + WGS, ... (tile j is t = blockIdx.x
// + j * gridDim.x), so one warpgroup's epilogue runs while the other's wgmma run. The producer's ring
// order is unchanged (tile after tile, k-tile after k-tile): the block's k-tile i = j * num_k_tiles + kt
// sits in stage i % STAGES, use i / STAGES, and only the warpgroup of tile j waits for it and releases
// it (empty[s]: count 4). A parity wait tells apart only neighbouring phases of a barrier, so a
// warpgroup may not wait on its tile's stages before the other has passed its waits on the tile
// before (else warpgroup 1, waiting for use 2 of a stage, took use 0's completed phase for its own):
// order[g] (static shared, count 4: lane 0 of each warp of the other warpgroup, after its last full
// wait of tile j - 1) opens tile j for warpgroup g, its ((j - 1) / WGS)-th phase. Then every earlier
// use of each stage this tile waits on is consumed, and the next cannot be loaded before this tile
// releases it, so the parity is the tile's. One block per SM: layer2.0.conv1's 128x128 tiles of 9
// k-tiles, whose epilogue one block per SM does not otherwise hide.
__host__ __device__ constexpr int wgmma_tma_min_blocks(int bm, int bn, int stages) {
    return wgmma_launch_blocks(wgmma_ws_smem_bytes(bm, bn, stages));
}

template <int BM, int BN, int WGS, int STAGES, Schedule SCHEDULE = Schedule::TMA_WARP_SPECIALIZED,
          Epilogue EPILOGUE = Epilogue::FRAGMENTS>
__global__ void __launch_bounds__(WGS * 128 + TMA_PRODUCER_THREADS, wgmma_tma_min_blocks(BM, BN, STAGES))
conv_wgmma_tma(const half_bits *__restrict__ x, const half_bits *__restrict__ w, const float *__restrict__ bias,
               const half_bits *__restrict__ residual, half_bits *__restrict__ y, float *__restrict__ partial,
               int N, int H, int W, int C, int K, int P, int Q, int R, int S, int stride, int pad,
               int ldw, int num_k_tiles, int k_tiles_per_split, int relu, const half_bits *__restrict__ shortcut_x,
               int shortcut_h, int shortcut_w, int shortcut_c, int shortcut_stride, int main_k_tiles,
               const __grid_constant__ TmaDescriptor x_map, const __grid_constant__ TmaDescriptor w_map) {
    pdl_begin_prefetch_filter(w, K, K, ldw, num_k_tiles, num_k_tiles, false, false);   // as PERSISTENT
    static_assert(SCHEDULE == Schedule::TMA_WARP_SPECIALIZED || SCHEDULE == Schedule::TMA_PINGPONG,
                  "conv_wgmma_tma's schedules");
    constexpr bool PINGPONG = SCHEDULE == Schedule::TMA_PINGPONG, VEC = EPILOGUE == Epilogue::VEC16;
    constexpr int WM = PINGPONG ? BM : BM / WGS;   // rows per consumer warpgroup (PINGPONG: whole tiles)
    constexpr int MB = WM / 64;               // m64 blocks per consumer warpgroup
    constexpr int NACC = BN / 2;
    static_assert(WM % 64 == 0 && MB >= 1, "each warpgroup owns whole m64 blocks");
    static_assert(STAGES >= 2, "a ring");
    static_assert(TMA_PRODUCER_THREADS == 32, "the producer is one warp: warp 4 * WGS, lane 0 issues");
    constexpr unsigned int A_BYTES = BM * BK * 2, STAGE_BYTES = (BM + BN) * BK * 2;
    static_assert(A_BYTES % 1024 == 0 && STAGE_BYTES % 1024 == 0, "every TMA tile on a 128B-swizzle atom");
    constexpr unsigned int RING_BYTES = STAGES * STAGE_BYTES;
    static_assert(WGMMA_SMEM_ALIGN == 1024 && RING_BYTES + WGMMA_SMEM_ALIGN + 2 * STAGES * 8
                  <= wgmma_ws_smem_bytes(BM, BN, STAGES), "smem layout");
    extern __shared__ vec16 smem_vec[];
    const unsigned int ring = smem_addr(wgmma_aligned_smem(smem_vec));
    const unsigned int full_bar = ring + RING_BYTES, empty_bar = full_bar + STAGES * 8;
    static_assert(!PINGPONG || (WGS == 2 && wgmma_tma_min_blocks(BM, BN, STAGES) == 1),
                  "ping-pong: two warpgroups of whole tiles, one block per SM");
    __shared__ unsigned long long pingpong_order[2];   // PINGPONG only: order[g] opens warpgroup g's next tile

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int M = N * P * Q;
    const int n_tiles = (K + BN - 1) / BN, tiles = ((M + BM - 1) / BM) * n_tiles;
    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            mbarrier_init(full_bar + s * 8, 1);
            mbarrier_init(empty_bar + s * 8, PINGPONG ? 4 : WGS * 4);
        }
        if constexpr (PINGPONG) {
            mbarrier_init(smem_addr(&pingpong_order[0]), 4);
            mbarrier_init(smem_addr(&pingpong_order[1]), 4);
        }
        fence_mbarrier_init();
    }
    __syncthreads();   // the only block-wide barrier: every thread sees initialised mbarriers
    pdl_wait();        // common.cuh: from here on the earlier kernels' outputs (x, residual) are visible

    if (warp == WGS * 4) {   // the producer warp: one thread issues every load
        if (lane != 0) return;
        tma_prefetch_descriptor(x_map);
        tma_prefetch_descriptor(w_map);
        const fast_divmod by_ctiles(C / BK), by_s(S), by_pq(P * Q), by_q(Q);
        int stage = 0, phase = 0, i = 0;   // stage i % STAGES, parity of i / STAGES
        for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
            const int m0 = (t / n_tiles) * BM, n0 = (t % n_tiles) * BN;
            int pq, q;
            const int img = by_pq.divmod(pq, m0);
            const int p = by_q.divmod(q, pq);
            // the window's start: the tensor map's lower corner (-pad) + q * stride (geometry.TmaIm2colMap)
            const int w0 = q * stride - pad, h0 = p * stride - pad;
            for (int kt = 0; kt < num_k_tiles; ++kt, ++i) {
                if (i >= STAGES) mbarrier_wait_parity(empty_bar + stage * 8, phase ^ 1);
                int c_tile, s;
                const int tap = by_ctiles.divmod(c_tile, kt);
                const int r = by_s.divmod(s, tap);
                const unsigned int bar = full_bar + stage * 8, sA = ring + stage * STAGE_BYTES;
                mbarrier_arrive_expect_tx(bar, STAGE_BYTES);
                tma_load_im2col_4d(sA, x_map, c_tile * BK, w0, h0, img, (unsigned short)s, (unsigned short)r, bar);
                tma_load_2d(sA + A_BYTES, w_map, kt * BK, n0, bar);
                if (++stage == STAGES) { stage = 0; phase ^= 1; }
            }
        }
        return;
    }

    // Consumer warpgroups.
    const int wg = warpgroup_index(), warp_in_wg = warp & 3;
    float acc[MB][NACC];
    if constexpr (PINGPONG) {
        for (int j = wg;; j += WGS) {
            const int t = blockIdx.x + j * (int)gridDim.x;
            if (t >= tiles) break;
#pragma unroll
            for (int mb = 0; mb < MB; ++mb)
#pragma unroll
                for (int v = 0; v < NACC; ++v) acc[mb][v] = 0.f;
            if (j > 0) mbarrier_wait_parity(smem_addr(&pingpong_order[wg]), ((j - 1) / WGS) & 1);
            int prev_stage = 0;
            for (int kt = 0, i = j * num_k_tiles; kt < num_k_tiles; ++kt, ++i) {
                const int stage = i % STAGES;
                mbarrier_wait_parity(full_bar + stage * 8, (i / STAGES) & 1);
                if (kt == num_k_tiles - 1 && lane == 0) mbarrier_arrive(smem_addr(&pingpong_order[wg ^ 1]));
                const unsigned int sA = ring + stage * STAGE_BYTES;
                wgmma_ktile<BN, MB, WM>(acc, sA, sA + A_BYTES, 0);
                wgmma_wait<1>();   // the wgmma of k-tile kt - 1 are done: release its stage
#pragma unroll
                for (int mb = 0; mb < MB; ++mb) wgmma_fence_operands<NACC>(acc[mb]);
                if (kt > 0 && lane == 0) mbarrier_arrive(empty_bar + prev_stage * 8);
                prev_stage = stage;
            }
            wgmma_wait<0>();
#pragma unroll
            for (int mb = 0; mb < MB; ++mb) wgmma_fence_operands<NACC>(acc[mb]);
            if (lane == 0) mbarrier_arrive(empty_bar + prev_stage * 8);   // the tile's last stage
            if (t + WGS * (int)gridDim.x >= tiles) pdl_trigger();   // this warpgroup's last tile
            wgmma_epilogue<BN, MB, WM, false, VEC>(acc, (t / n_tiles) * BM, (t % n_tiles) * BN, 0, warp_in_wg, lane,
                                                   M, K, bias, residual, y, nullptr, relu);
        }
        return;
    }
    int stage = 0, phase = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
#pragma unroll
        for (int mb = 0; mb < MB; ++mb)
#pragma unroll
            for (int j = 0; j < NACC; ++j) acc[mb][j] = 0.f;
        int prev_stage = 0;
        for (int kt = 0; kt < num_k_tiles; ++kt) {
            mbarrier_wait_parity(full_bar + stage * 8, phase);
            const unsigned int sA = ring + stage * STAGE_BYTES;
            wgmma_ktile<BN, MB, WM>(acc, sA, sA + A_BYTES, wg);
            wgmma_wait<1>();   // the wgmma of k-tile kt - 1 are done: release its stage
#pragma unroll
            for (int mb = 0; mb < MB; ++mb) wgmma_fence_operands<NACC>(acc[mb]);
            if (kt > 0 && lane == 0) mbarrier_arrive(empty_bar + prev_stage * 8);
            prev_stage = stage;
            if (++stage == STAGES) { stage = 0; phase ^= 1; }
        }
        wgmma_wait<0>();
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) wgmma_fence_operands<NACC>(acc[mb]);
        if (lane == 0) mbarrier_arrive(empty_bar + prev_stage * 8);   // the tile's last stage
        if (t + (int)gridDim.x >= tiles) pdl_trigger();   // the block's last tile: the next kernel may launch
        // Batched residual loads only with one block per SM: two blocks of WGS * 128 + 32 threads leave
        // ptxas 96 registers per thread, and the 128x128 tile spilled 200 bytes with them (nvcc 13.0).
        constexpr bool BATCHED = MB == 1 && BN <= 128 && wgmma_tma_min_blocks(BM, BN, STAGES) == 1;
        wgmma_epilogue<BN, MB, WM, BATCHED, VEC>(acc, (t / n_tiles) * BM, (t % n_tiles) * BN, wg, warp_in_wg, lane,
                                                 M, K, bias, residual, y, nullptr, relu);
    }
}
