// conv_wgmma_ws: conv_wgmma (kernels/conv_wgmma.cu) with warp specialisation on cp.async loads, an
// experiment the tuner never chose (NOTES.md outcome 11: correct, 17-23% slower than the plain wgmma
// tiles). Not part of the served module: compiled only with kernels/dev/conv_wgmma_ws.py, which checks
// it against a float32 reference and then times it beside the served plans. The TMA tiles
// (conv_wgmma_tma) took over its full / empty mbarrier ring.

#include "../common.cuh"
#include "../epilogue.cuh"
#include "../loaders.cuh"
#include "../wgmma.cuh"

// ---- v2: warp-specialised (conv_wgmma_ws) -----------------------------------
//
// The same tile, descriptors, loaders and epilogue as conv_wgmma, with the
// roles split between warpgroups and the per-k-tile __syncthreads replaced by
// per-stage mbarriers (wgmma.cuh):
//   warpgroups 0 .. WGS-1  consumers: rows as in conv_wgmma (warpgroup g owns
//                          rows g*BM/WGS ...), wgmma and the epilogue only;
//   warpgroup WGS          producer: 128 threads issue every cp.async of the
//                          A (im2col) and B (filter) tiles (loaders.cuh with
//                          THREADS = 128), then leave.
// Per stage s two barriers after the ring (geometry.SMEM_BYTES, wgmma_ws):
//   full[s]   count 128: each producer thread, after issuing its copies of
//             the tile, makes one cp.async.mbarrier.arrive.noinc, which arrives
//             when all its copies so far have landed; the phase completes when
//             the whole tile is in shared memory.
//   empty[s]  count 4*WGS: lane 0 of each consumer warp arrives once that
//             warp's wgmma.wait_group says the wgmma reading the stage are done.
// k-tile i (of this split) uses stage s = i % STAGES, as the n = i / STAGES-th
// use of the stage: consumers wait for full[s] phase n (parity n & 1); the
// producer, for i >= STAGES, waits for empty[s] phase n - 1 (the consumers'
// release of tile i - STAGES; parity (n - 1) & 1) before refilling it.
// Neither side can get two phases ahead of the other: refilling a stage needs
// the release of its previous tile, and releasing needs the tile. Consumers
// keep one k-tile of wgmma in flight (wait_group 1) and release tile i - 1
// after issuing tile i; the producer runs up to STAGES tiles ahead of the
// consumers' releases. No __syncthreads after the barriers are initialised:
// the producer warpgroup exits after issuing its last copies (their
// completion reaches the consumers through the full barriers, and the block's
// shared memory lives until the consumers finish); the epilogue touches no
// shared memory.
// Registers: the consumers hold no loader state, the producer no
// accumulators; __launch_bounds__((WGS + 1) * 128, 1) caps each thread at
// 65536 / 384 = 170 -> 168 registers, enough without setmaxnreg (ptxas 13.0:
// 98 registers at 128x128, 154 at 128x256, 168 at 256x128, no spills).
template <int BM, int BN, int WGS, int STAGES>
__global__ void __launch_bounds__((WGS + 1) * 128, 1)
conv_wgmma_ws(const half_bits *__restrict__ x, const half_bits *__restrict__ w, const float *__restrict__ bias,
              const half_bits *__restrict__ residual, half_bits *__restrict__ y, float *__restrict__ partial,
              int N, int H, int W, int C, int K, int P, int Q, int R, int S, int stride, int pad,
              int ldw, int num_k_tiles, int k_tiles_per_split, int relu, const half_bits *__restrict__ shortcut_x,
              int shortcut_h, int shortcut_w, int shortcut_c, int shortcut_stride, int main_k_tiles) {
    pdl_begin_prefetch_filter(w, BN, K, ldw, num_k_tiles, k_tiles_per_split);   // common.cuh
    constexpr int PRODUCER_THREADS = 128;     // one warpgroup
    constexpr int WM = BM / WGS;              // rows per consumer warpgroup
    constexpr int MB = WM / 64;               // m64 blocks per consumer warpgroup
    constexpr int NACC = BN / 2;              // fp32 accumulators per thread per m64 block
    static_assert(WM % 64 == 0 && MB >= 1, "each warpgroup owns whole m64 blocks");
    static_assert(STAGES >= 2, "a ring");
    static_assert((BM * 8) % PRODUCER_THREADS == 0 && (BN * 8) % PRODUCER_THREADS == 0, "loader mapping");
    constexpr int A_ITERS = BM * 8 / PRODUCER_THREADS, B_ITERS = BN * 8 / PRODUCER_THREADS;
    constexpr int ROW_STEP = PRODUCER_THREADS / 8;
    constexpr int A_HALFS = BM * BK, STAGE_HALFS = (BM + BN) * BK;   // multiples of 512 halfs = 1024 bytes
    constexpr int RING_BYTES = STAGES * STAGE_HALFS * 2;

    // Ring on a 1024-byte boundary (as conv_wgmma), then full[STAGES], empty[STAGES] (8 bytes each).
    static_assert(WGMMA_SMEM_ALIGN == 1024 && RING_BYTES + WGMMA_SMEM_ALIGN + 2 * STAGES * 8
                  <= wgmma_ws_smem_bytes(BM, BN, STAGES), "smem layout");
    extern __shared__ vec16 smem_vec[];
    half_bits *smem = wgmma_aligned_smem(smem_vec);
    const unsigned int ring = smem_addr(smem);
    const unsigned int full_bar = ring + RING_BYTES, empty_bar = full_bar + STAGES * 8;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warpgroup_index(), warp_in_wg = warp & 3;
    const int M = N * P * Q;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    const int kt_begin = blockIdx.z * k_tiles_per_split;
    const int kt_end = min(num_k_tiles, kt_begin + k_tiles_per_split);
    const int nkt = kt_end - kt_begin;

    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            mbarrier_init(full_bar + s * 8, PRODUCER_THREADS);
            mbarrier_init(empty_bar + s * 8, WGS * 4);
        }
        fence_mbarrier_init();
    }
    __syncthreads();   // the only block-wide barrier: every thread sees initialised mbarriers

    if (wg == WGS) {
        // Producer warpgroup. Loader state as conv_wgmma's, over this warpgroup's 128 threads.
        const int ptid = tid - WGS * 128;
        const int chunk = ptid & 7;
        int a_base[A_ITERS], a_ih[A_ITERS], a_iw[A_ITERS];
        igemm_a_rows<A_ITERS, ROW_STEP>(a_base, a_ih, a_iw, m0, ptid, M, H, W, C, P, Q, stride, pad);
        const fast_divmod by_ctiles(C / BK), by_s(S);
        int stage = 0, phase = 0;   // stage i % STAGES, parity of (i / STAGES)
        for (int i = 0; i < nkt; ++i) {
            if (i >= STAGES) mbarrier_wait_parity(empty_bar + stage * 8, phase ^ 1);
            half_bits *sA = smem + stage * STAGE_HALFS;
            half_bits *sB = sA + A_HALFS;
            const int kt = kt_begin + i;
            igemm_load_b<B_ITERS, ROW_STEP>(sB, w, n0, K, ldw, kt, ptid, chunk);
            igemm_load_a<A_ITERS, ROW_STEP>(sA, x, a_base, a_ih, a_iw, kt, by_ctiles, by_s, H, W, C, ptid, chunk);
            cp_async_mbarrier_arrive_noinc(full_bar + stage * 8);
            if (++stage == STAGES) { stage = 0; phase ^= 1; }
        }
        cp_async_wait<0>();   // no effect: the producer commits no cp.async group (the full barriers track its copies)
        return;
    }

    // Consumer warpgroups.
    float acc[MB][NACC];
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
        for (int j = 0; j < NACC; ++j) acc[mb][j] = 0.f;

    int stage = 0, phase = 0, prev_stage = 0;
    for (int i = 0; i < nkt; ++i) {
        mbarrier_wait_parity(full_bar + stage * 8, phase);
        fence_proxy_async_shared();   // the cp.async writes (generic proxy) before the wgmma reads (async proxy)
        const unsigned int sA = ring + stage * STAGE_HALFS * 2;
        wgmma_ktile<BN, MB, WM>(acc, sA, sA + A_HALFS * 2, wg);
        wgmma_wait<1>();   // the wgmma of tile i - 1 are done: release its stage
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) wgmma_fence_operands<NACC>(acc[mb]);
        if (i > 0 && lane == 0) mbarrier_arrive(empty_bar + prev_stage * 8);
        prev_stage = stage;
        if (++stage == STAGES) { stage = 0; phase ^= 1; }
    }
    wgmma_wait<0>();   // (the last stage needs no release: the producer has no tile left)
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) wgmma_fence_operands<NACC>(acc[mb]);

    // Pair by pair: the 384-thread launch caps the registers at 168, and batched residual loads spill.
    wgmma_epilogue<BN, MB, WM, false>(acc, m0, n0, wg, warp_in_wg, lane, M, K, bias, residual, y, partial, relu);
}
