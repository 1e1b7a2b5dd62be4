// The cp.async loaders of the implicit-GEMM kernels (conv_implicit_gemm.cu
// ConvInput::FP16_NHWC, conv_wgmma.cu): one BK = 64 k-tile of A (im2col rows) and of B
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
//
// FUSED SHORTCUT (igemm_load_a_shortcut): a downsampling block's projection,
// ys = conv1x1/stride(xs), summed into its second 3x3/1 convolution as extra
// k-tiles of the same reduction. The GEMM's reduction is the 9*C values of
// the 3x3 taps followed by the Cs channels of xs at input pixel (p*stride,
// q*stride) of the same image; the filter rows are the two filters
// concatenated ([K][9*C + Cs]) and the bias is their sum. So the kernel that
// computes relu(conv3x3(x) + b + ys + bs) reads xs once, 16 bytes per copy like
// every other A row, and neither the projection's output nor its kernel exists.
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

// A: the im2col rows of the k-tile of filter tap (r, s), input channels c0 ... c0 + 63 (fp16 NHWC input,
// C % 64 == 0).
template <int A_ITERS, int ROW_STEP>
__device__ __forceinline__ void igemm_load_a_tap(half_bits *sA, const half_bits *__restrict__ x,
                                                 const int (&a_base)[A_ITERS], const int (&a_ih)[A_ITERS],
                                                 const int (&a_iw)[A_ITERS], int r, int s, int c0, int H, int W,
                                                 int C, int tid, int chunk) {
#pragma unroll
    for (int i = 0; i < A_ITERS; ++i) {
        const int row = tid / 8 + i * ROW_STEP;
        const int ih = a_ih[i] + r, iw = a_iw[i] + s;
        const bool ok = (unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W;
        // One 32-bit element offset (the input has fewer than 2^31 elements), widened once: x + offset is
        // a single wide multiply-add, where the 64-bit sum of the parts took five instructions per row.
        const unsigned int offset = ok ? (unsigned int)(a_base[i] + (ih * W + iw) * C + c0 + chunk * 8) : 0u;
        cp_async_16(smem_addr(sA + swz(row, chunk)), x + offset, ok ? 16 : 0);
    }
}

// A: the im2col rows of k-tile kt, which is filter tap kt / c_tiles, channels (kt % c_tiles) * 64 ...
template <int A_ITERS, int ROW_STEP>
__device__ __forceinline__ void igemm_load_a(half_bits *sA, const half_bits *__restrict__ x,
                                             const int (&a_base)[A_ITERS], const int (&a_ih)[A_ITERS],
                                             const int (&a_iw)[A_ITERS], int kt, int c_tiles, int S, int H, int W,
                                             int C, int tid, int chunk) {
    const int tap = kt / c_tiles, c0 = (kt - tap * c_tiles) * BK;
    const int r = tap / S, s = tap - r * S;
    igemm_load_a_tap<A_ITERS, ROW_STEP>(sA, x, a_base, a_ih, a_iw, r, s, c0, H, W, C, tid, chunk);
}

// The same with the two divisions by common.cuh's fast_divmod (by_ctiles: C / 64, by_s: S), built once
// per kernel from its arguments: per k-tile the hardware divisions would be ~55 of conv_wgmma's ~225
// instructions (SASS, kernels/NOTES.md), in a main loop that issues little else besides the copies and four wgmma.
template <int A_ITERS, int ROW_STEP>
__device__ __forceinline__ void igemm_load_a(half_bits *sA, const half_bits *__restrict__ x,
                                             const int (&a_base)[A_ITERS], const int (&a_ih)[A_ITERS],
                                             const int (&a_iw)[A_ITERS], int kt, const fast_divmod &by_ctiles,
                                             const fast_divmod &by_s, int H, int W, int C, int tid, int chunk) {
    int c_tile, s;
    const int tap = by_ctiles.divmod(c_tile, kt);
    const int r = by_s.divmod(s, tap);
    igemm_load_a_tap<A_ITERS, ROW_STEP>(sA, x, a_base, a_ih, a_iw, r, s, c_tile * BK, H, W, C, tid, chunk);
}

// A: k-tile kt_shortcut (channels kt_shortcut*64 ... +63) of the fused shortcut (header), for the rows of
// a 3x3 conv of stride 1 and padding `pad` over an H x W x C input (their igemm_a_rows state: image offset
// n*H*W*C, top-left input coordinate p - pad, q - pad; inv_hwc = 1 / (H*W*C)). The shortcut's input xs is
// [N][Hs][Ws][Cs]; its pixel for output (p, q) is (p*stride_s, q*stride_s). Rows past M (coordinate -2^20)
// are zero-filled.
template <int A_ITERS, int ROW_STEP>
__device__ __forceinline__ void igemm_load_a_shortcut(half_bits *sA, const half_bits *__restrict__ xs,
                                                      const int (&a_base)[A_ITERS], const int (&a_ih)[A_ITERS],
                                                      const int (&a_iw)[A_ITERS], int kt_shortcut, float inv_hwc, int pad,
                                                      int Hs, int Ws, int Cs, int stride_s, int tid, int chunk) {
    const int c0 = kt_shortcut * BK;
#pragma unroll
    for (int i = 0; i < A_ITERS; ++i) {
        const int row = tid / 8 + i * ROW_STEP;
        const int ih = (a_ih[i] + pad) * stride_s, iw = (a_iw[i] + pad) * stride_s;
        const bool ok = (unsigned)ih < (unsigned)Hs && (unsigned)iw < (unsigned)Ws;
        // a_base = n * hwc exactly, so the rounded fp32 quotient is n (|error| < 1e-4 for n < 2^12): three
        // instructions, where the integer division kept enough temporaries live to spill conv_wgmma_ws's producer.
        const int n = __float2int_rn(__int2float_rn(a_base[i]) * inv_hwc);
        const half_bits *src = ok ? xs + ((n * Hs + ih) * Ws + iw) * Cs + c0 + chunk * 8 : xs;
        cp_async_16(smem_addr(sA + swz(row, chunk)), src, ok ? 16 : 0);
    }
}
#endif  // FUSEDRESNET_LOADERS_CUH
