// The cp.async loaders of the implicit-GEMM kernels (conv_implicit_gemm.cu
// MODE 0, conv_wgmma.cu): one BK = 64 k-tile of A (im2col rows) and of B
// (filter rows) into swizzled [rows][64] shared-memory tiles (common.cuh, swz).
//
// Thread mapping: thread tid copies 16-byte chunk tid % 8 of rows tid / 8,
// tid / 8 + ROW_STEP, ... (ROW_STEP = THREADS / 8): ITERS = rows * 8 / THREADS
// rows of each tile. k-tile kt is filter tap kt / (C / 64), channels
// (kt % (C / 64)) * 64 ... + 63 (the im2col layout: conv_implicit_gemm.cu);
// an A row past M or whose tap falls on the padding is zero-filled (src-size
// 0), a B row past K likewise. The caller passes chunk = tid & 7 computed
// once before the loader state (as the kernels did before these functions were
// shared: recomputing it inside changes the register allocation,
// kernels/sass_diff.py).
#ifndef FUSEDRESNET_LOADERS_CUH
#define FUSEDRESNET_LOADERS_CUH
#include "common.cuh"

// Per-thread A-row state: for each row this thread copies, the image offset
// (n*H*W*C) and the top-left input coordinate of its output pixel; rows past
// M get a row coordinate that is out of bounds for every tap (zero rows).
template <int A_ITERS, int ROW_STEP>
__device__ __forceinline__ void igemm_a_rows(int (&a_base)[A_ITERS], int (&a_ih)[A_ITERS], int (&a_iw)[A_ITERS],
                                             int m0, int tid, int M, int H, int W, int C, int P, int Q, int stride,
                                             int pad) {
#pragma unroll
    for (int i = 0; i < A_ITERS; ++i) {
        const int m = m0 + tid / 8 + i * ROW_STEP;
        if (m < M) {
            const int n = m / (P * Q), pq = m - n * (P * Q);
            const int p = pq / Q, q = pq - p * Q;
            a_base[i] = n * H * W * C;
            a_ih[i] = p * stride - pad;
            a_iw[i] = q * stride - pad;
        } else {
            a_base[i] = 0; a_ih[i] = -(1 << 20); a_iw[i] = 0;   // always out of bounds: zero rows
        }
    }
}

// B: filter rows n0 .. n0 + B_ITERS * ROW_STEP - 1, reduction values kt*64 ... +63.
template <int B_ITERS, int ROW_STEP>
__device__ __forceinline__ void igemm_load_b(half_bits *sB, const half_bits *__restrict__ w, int n0, int K, int ldw,
                                             int kt, int tid, int chunk) {
#pragma unroll
    for (int i = 0; i < B_ITERS; ++i) {
        const int row = tid / 8 + i * ROW_STEP;
        const int k = n0 + row;
        const half_bits *src = w + (u64)min(k, K - 1) * ldw + kt * BK + chunk * 8;
        cp_async_16(smem_addr(sB + swz(row, chunk)), src, k < K ? 16 : 0);
    }
}

// A: the im2col rows of k-tile kt (fp16 NHWC input, C % 64 == 0).
template <int A_ITERS, int ROW_STEP>
__device__ __forceinline__ void igemm_load_a(half_bits *sA, const half_bits *__restrict__ x,
                                             const int (&a_base)[A_ITERS], const int (&a_ih)[A_ITERS],
                                             const int (&a_iw)[A_ITERS], int kt, int c_tiles, int S, int H, int W,
                                             int C, int tid, int chunk) {
    const int tap = kt / c_tiles, c0 = (kt - tap * c_tiles) * BK;
    const int r = tap / S, s = tap - r * S;
#pragma unroll
    for (int i = 0; i < A_ITERS; ++i) {
        const int row = tid / 8 + i * ROW_STEP;
        const int ih = a_ih[i] + r, iw = a_iw[i] + s;
        const bool ok = (unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W;
        const half_bits *src = ok ? x + a_base[i] + (ih * W + iw) * C + c0 + chunk * 8 : x;
        cp_async_16(smem_addr(sA + swz(row, chunk)), src, ok ? 16 : 0);
    }
}
#endif  // FUSEDRESNET_LOADERS_CUH
