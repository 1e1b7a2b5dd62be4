// The mma.sync warp tile of every mma.sync kernel (conv_implicit_gemm.cu,
// conv3x3_patch.cu, stem.cu): one warp owns MI x NI m16n8 tiles of D (MI*16
// rows, NI*8 columns) as fp32 accumulators acc[mi][ni][4] and runs KSTEPS k16
// steps of the reduction out of shared memory. Per step: MI ldmatrix.x4 of A
// (one 16 x 16 fragment each), NI/2 ldmatrix.x4 of B (16 filter rows x 16
// values: two n8 fragments each), MI*NI mma.sync m16n8k16.
//
// ldmatrix.x4 takes one 16-byte row address per lane (8 lanes per 8x8 matrix):
//   A: lane l addresses row l % 16 of the m16 tile, k chunk 2*kk + l / 16,
//      which yields the m16n8k16 A fragment a0..a3;
//   B: lane l addresses filter row (l % 8) + 8 * (l / 16) of the n16 pair,
//      k chunk 2*kk + (l / 8) % 2, which yields b0, b1 of n8 tiles 2nj, 2nj+1.
// Warp (warp_m, warp_n) of the block owns A rows warp_m*MI*16 .. +MI*16-1 and
// B (filter) rows warp_n*NI*8 .. +NI*8-1 of the block's tiles. The kernels
// differ only in where a row's 16-byte chunk lives (their tile layouts and
// swizzles), so they pass two functions returning this lane's shared-memory
// byte address:
//   a_addr(mi, row, chunk)   row = warp_m*MI*16 + mi*16 + l % 16 (mi for
//                            layouts that keep per-m16-tile state)
//   b_addr(row, chunk)       row = warp_n*NI*8 + nj*16 + l % 8 + 8 * (l / 16)
// The row sums are associated as the kernels wrote them before this code was
// shared: another association changes the generated code (kernels/sass_diff.py).
#ifndef FUSEDRESNET_WARP_MMA_CUH
#define FUSEDRESNET_WARP_MMA_CUH
#include "common.cuh"

template <int MI, int NI>
__device__ __forceinline__ void warp_mma_zero(float (&acc)[MI][NI][4]) {
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
}

// The A and B fragments of k16 step kk.
template <int MI, int NI, class AAddr, class BAddr>
__device__ __forceinline__ void warp_mma_load_frags(unsigned int (&a)[MI][4], unsigned int (&b)[NI][2], int kk,
                                                    int lane, int warp_m, int warp_n, const AAddr &a_addr,
                                                    const BAddr &b_addr) {
    static_assert(NI % 2 == 0, "B fragments are loaded two n8 tiles at a time");
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
        const int row = warp_m * (MI * 16) + mi * 16 + (lane & 15);
        const int ch = kk * 2 + (lane >> 4);
        ldmatrix_x4(a_addr(mi, row, ch), a[mi][0], a[mi][1], a[mi][2], a[mi][3]);
    }
#pragma unroll
    for (int nj = 0; nj < NI / 2; ++nj) {
        const int row = warp_n * (NI * 8) + nj * 16 + (lane & 7) + ((lane >> 4) << 3);
        const int ch = kk * 2 + ((lane >> 3) & 1);
        ldmatrix_x4(b_addr(row, ch), b[2 * nj][0], b[2 * nj][1], b[2 * nj + 1][0], b[2 * nj + 1][1]);
    }
}

template <int MI, int NI>
__device__ __forceinline__ void warp_mma_step(float (&acc)[MI][NI][4], const unsigned int (&a)[MI][4],
                                              const unsigned int (&b)[NI][2]) {
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) mma_16816(acc[mi][ni], a[mi], b[ni]);
}

// acc += the warp's KSTEPS k16 steps: load the fragments of a step, multiply, next step.
template <int MI, int NI, int KSTEPS, class AAddr, class BAddr>
__device__ __forceinline__ void warp_mma(float (&acc)[MI][NI][4], int lane, int warp_m, int warp_n,
                                         const AAddr &a_addr, const BAddr &b_addr) {
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
        unsigned int a[MI][4], b[NI][2];
        warp_mma_load_frags<MI, NI>(a, b, kk, lane, warp_m, warp_n, a_addr, b_addr);
        warp_mma_step<MI, NI>(acc, a, b);
    }
}

// The same with the fragments double-buffered: those of step kk+1 are loaded
// before the mma of step kk (ldmatrix is asm volatile, so the order written is
// the order issued). The fragment registers are the caller's (`frags`, declared
// where the k-loop body begins): declared in here, their allocas would be
// hoisted to the top of the kernel by the forced inlining, which reorders the
// accumulators' PHIs and changes the register allocation (kernels/sass_diff.py).
template <int MI, int NI>
struct WarpFrags { unsigned int a[2][MI][4], b[2][NI][2]; };

template <int MI, int NI, int KSTEPS, class AAddr, class BAddr>
__device__ __forceinline__ void warp_mma_pipelined(float (&acc)[MI][NI][4], WarpFrags<MI, NI> &frags, int lane,
                                                   int warp_m, int warp_n, const AAddr &a_addr, const BAddr &b_addr) {
    auto &a = frags.a;
    auto &b = frags.b;
    warp_mma_load_frags<MI, NI>(a[0], b[0], 0, lane, warp_m, warp_n, a_addr, b_addr);
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
        if (kk + 1 < KSTEPS)
            warp_mma_load_frags<MI, NI>(a[(kk + 1) & 1], b[(kk + 1) & 1], kk + 1, lane, warp_m, warp_n, a_addr,
                                        b_addr);
        warp_mma_step<MI, NI>(acc, a[kk & 1], b[kk & 1]);
    }
}
#endif  // FUSEDRESNET_WARP_MMA_CUH
