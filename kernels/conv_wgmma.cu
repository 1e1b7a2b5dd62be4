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
//
// EPILOGUE. The wgmma accumulator layout per warp is the mma.sync m16n8 one
// (epilogue.cuh) repeated over the BN/8 column groups: warp w of the
// warpgroup holds rows 16w .. 16w+15 of its m64 block, and d[4j..4j+3] is the
// m16n8 fragment of columns 8j .. 8j+7. The epilogue is epilogue.cuh's.
//
// Versions (measurements in NOTES.md):
//   v1  cp.async ring + wgmma from shared-memory descriptors, all threads load
//       and compute (no warp specialisation, no TMA, no mbarriers).

#include "common.cuh"
#include "epilogue.cuh"
#include "loaders.cuh"

// The 64-bit shared-memory matrix descriptor of a K-major operand tile in the
// 128-byte swizzle (PTX ISA, "Matrix Descriptor Format"): start address >> 4
// (bits 0-13), leading-dimension byte offset >> 4 (16-29), stride-dimension
// byte offset >> 4 (32-45), base offset (49-51), swizzle mode (62-63, 1 = 128B).
__device__ __forceinline__ u64 wgmma_desc_sw128(unsigned int smem_byte_addr) {
    return (u64)((smem_byte_addr & 0x3FFFF) >> 4)
         | ((u64)(16 >> 4) << 16)
         | ((u64)(1024 >> 4) << 32)
         | ((u64)1 << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory"); }
// Orders the generic-proxy writes (cp.async, plain stores) of this thread to
// shared memory before later async-proxy reads (wgmma operands).
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Ties the accumulators to this point of the instruction stream: the compiler
// may not move reads or writes of them across (they are in flight between
// wgmma.mma_async and wgmma.wait_group, invisible to it).
template <int NACC>
__device__ __forceinline__ void wgmma_fence_operands(float *d) {
#pragma unroll
    for (int i = 0; i < NACC; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}

// D[64 x N] += A[64 x 16] * B[N x 16]^T, fp16 in, fp32 accumulate; A and B
// K-major in shared memory (descriptors), scale-d 1, no negation, no transpose.
// One instruction per N in {64, 128, 256}; its N/2 fp32 accumulators per thread
// are operands %0 .. %(N/2-1) (WGMMA_REGS_<N/2> in the text, WGMMA_ACC_<N/2>
// in the operand list) and the two descriptors the next two operands.
#define WGMMA_REGS_32 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WGMMA_REGS_64 WGMMA_REGS_32 ", " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WGMMA_REGS_128 WGMMA_REGS_64 ", " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define WGMMA_ACC_8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), \
                       "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define WGMMA_ACC_32(i) WGMMA_ACC_8(i), WGMMA_ACC_8(i + 8), WGMMA_ACC_8(i + 16), WGMMA_ACC_8(i + 24)
#define WGMMA_ACC_64(i) WGMMA_ACC_32(i), WGMMA_ACC_32(i + 32)
#define WGMMA_ACC_128(i) WGMMA_ACC_64(i), WGMMA_ACC_64(i + 64)
// N, accumulators per thread, operand numbers of the two descriptors.
#define WGMMA_M64K16(N, NACC, DESC_A, DESC_B)                                                            \
    asm volatile("wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.f16.f16 "                               \
                 "{" WGMMA_REGS_##NACC "}, %" #DESC_A ", %" #DESC_B ", 1, 1, 1, 0, 0;\n"                 \
                 : WGMMA_ACC_##NACC(0) : "l"(desc_a), "l"(desc_b))

template <int BN>
__device__ __forceinline__ void wgmma_m64k16(float *d, u64 desc_a, u64 desc_b) {
    static_assert(BN == 64 || BN == 128 || BN == 256, "wgmma n64 / n128 / n256");
    if constexpr (BN == 64) WGMMA_M64K16(64, 32, 32, 33);
    else if constexpr (BN == 128) WGMMA_M64K16(128, 64, 64, 65);
    else WGMMA_M64K16(256, 128, 128, 129);
}
#undef WGMMA_M64K16

template <int BM, int BN, int WGS, int STAGES>
__global__ void __launch_bounds__(WGS * 128, 1)
conv_wgmma(const half_bits *__restrict__ x, const half_bits *__restrict__ w, const float *__restrict__ bias,
           const half_bits *__restrict__ residual, half_bits *__restrict__ y, float *__restrict__ partial,
           int N, int H, int W, int C, int K, int P, int Q, int R, int S, int stride, int pad,
           int ldw, int num_k_tiles, int k_tiles_per_split, int relu) {
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
    constexpr unsigned int ALIGN_MASK = WGMMA_SMEM_ALIGN - 1;
    extern __shared__ vec16 smem_vec[];
    const unsigned int raw = smem_addr(smem_vec);
    half_bits *smem = reinterpret_cast<half_bits *>(reinterpret_cast<unsigned char *>(smem_vec)
                                                    + (((raw + ALIGN_MASK) & ~ALIGN_MASK) - raw));

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, warp_in_wg = warp & 3;
    const int M = N * P * Q;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    const int kt_begin = blockIdx.z * k_tiles_per_split;
    const int kt_end = min(num_k_tiles, kt_begin + k_tiles_per_split);
    const int nkt = kt_end - kt_begin;

    // Loader state and loaders: loaders.cuh, as in conv_implicit_gemm.cu (MODE 0).
    const int chunk = tid & 7;
    int a_base[A_ITERS], a_ih[A_ITERS], a_iw[A_ITERS];
    igemm_a_rows<A_ITERS, ROW_STEP>(a_base, a_ih, a_iw, m0, tid, M, H, W, C, P, Q, stride, pad);
    const int c_tiles = C / BK;

    auto load_tile = [&](int stage, int kt) {
        half_bits *sA = smem + stage * STAGE_HALFS;
        half_bits *sB = sA + A_HALFS;
        igemm_load_b<B_ITERS, ROW_STEP>(sB, w, n0, K, ldw, kt, tid, chunk);
        igemm_load_a<A_ITERS, ROW_STEP>(sA, x, a_base, a_ih, a_iw, kt, c_tiles, S, H, W, C, tid, chunk);
    };

    float acc[MB][NACC];
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
        for (int j = 0; j < NACC; ++j) acc[mb][j] = 0.f;

#pragma unroll
    for (int s = 0; s < STAGES - 2; ++s) {
        if (s < nkt) load_tile(s, kt_begin + s);
        cp_async_commit();
    }

    for (int i = 0; i < nkt; ++i) {
        cp_async_wait<STAGES - 3>();
        fence_proxy_async_shared();
        __syncthreads();
        fence_proxy_async_shared();
        const int next = i + STAGES - 2;
        if (next < nkt) load_tile(next % STAGES, kt_begin + next);
        cp_async_commit();

        const unsigned int sA = smem_addr(smem + (i % STAGES) * STAGE_HALFS);
        const unsigned int sB = sA + A_HALFS * 2;
        const u64 desc_b = wgmma_desc_sw128(sB);
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) wgmma_fence_operands<NACC>(acc[mb]);
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
        wgmma_wait<1>();
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) wgmma_fence_operands<NACC>(acc[mb]);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) wgmma_fence_operands<NACC>(acc[mb]);
    cp_async_wait<0>();

    // Epilogue straight from the accumulators (layout in the header).
    const int g = lane >> 2, t4 = lane & 3;
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
