// The fused epilogue of every convolution kernel, per output element, fp32:
//     v = acc + bias[k]            (the folded BatchNorm)
//     v += residual[m, k]          (the block's identity, when residual != nullptr)
//     v = max(v, 0)                (when relu)
//     y[m, k] = fp16(v)            (NHWC: row m = output pixel, K contiguous channels)
// or, for one slice of a split-K reduction, the raw fp32 sums into
// partial[slice][m][k]; the last block of the output tile to finish adds the
// slices and applies the epilogue above (splitk_fixup, below).
//
// Two granularities: a pair of adjacent channels straight from the
// accumulator fragments (thread (g = lane/4, t = lane%4) of an m16n8 tile
// holds rows g and g+8, columns 2t and 2t+1; the wgmma accumulators repeat
// that layout), and 8 channels (16 bytes of output) per thread where the
// values were gathered first (the split-K fixup, the shared-memory epilogue
// of conv3x3_patch).
#ifndef FUSEDRESNET_EPILOGUE_CUH
#define FUSEDRESNET_EPILOGUE_CUH
#include "common.cuh"

// Channels k, k+1 of the element at offset `off` (= m*K + k) of y / residual.
__device__ __forceinline__ void epilogue_pair(float v0, float v1, int k, u64 off, const float *__restrict__ bias,
                                              const half_bits *__restrict__ residual, half_bits *__restrict__ y,
                                              int relu) {
    v0 += bias[k]; v1 += bias[k + 1];
    if (residual != nullptr) {
        float r0, r1;
        unpack_half2(*reinterpret_cast<const half2_bits *>(residual + off), r0, r1);
        v0 += r0; v1 += r1;
    }
    if (relu) { v0 = fmaxf(v0, 0.f); v1 = fmaxf(v1, 0.f); }
    *reinterpret_cast<half2_bits *>(y + off) = pack_half2(v0, v1);
}

// The fragment epilogue of the implicit-GEMM kernels: with a split-K
// workspace (partial != nullptr) the pair goes to slice blockIdx.z of
// partial[splits][M][K] as fp32, else through epilogue_pair.
__device__ __forceinline__ void epilogue_pair_or_partial(float v0, float v1, int k, u64 off, int M, int K,
                                                         const float *__restrict__ bias,
                                                         const half_bits *__restrict__ residual,
                                                         half_bits *__restrict__ y, float *__restrict__ partial,
                                                         int relu) {
    if (partial != nullptr) {
        float2 pv; pv.x = v0; pv.y = v1;
        *reinterpret_cast<float2 *>(partial + (u64)blockIdx.z * M * K + off) = pv;
        return;
    }
    epilogue_pair(v0, v1, k, off, bias, residual, y, relu);
}

// 8 channels at `off` (a multiple of 8): v already holds acc + bias; adds the
// residual, applies ReLU and stores 16 bytes.
__device__ __forceinline__ void epilogue_store8(float (&v)[8], u64 off, const half_bits *__restrict__ residual,
                                                half_bits *__restrict__ y, int relu) {
    if (residual != nullptr) {
        const vec16 r = *reinterpret_cast<const vec16 *>(residual + off);
        float lo, hi;
        unpack_half2(r.x, lo, hi); v[0] += lo; v[1] += hi;
        unpack_half2(r.y, lo, hi); v[2] += lo; v[3] += hi;
        unpack_half2(r.z, lo, hi); v[4] += lo; v[5] += hi;
        unpack_half2(r.w, lo, hi); v[6] += lo; v[7] += hi;
    }
    if (relu) {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = fmaxf(v[j], 0.f);
    }
    vec16 out;
    out.x = pack_half2(v[0], v[1]); out.y = pack_half2(v[2], v[3]);
    out.z = pack_half2(v[4], v[5]); out.w = pack_half2(v[6], v[7]);
    *reinterpret_cast<vec16 *>(y + off) = out;
}

// ---- split-K in one kernel ---------------------------------------------------
// A split-K launch has grid (m-tiles, n-tiles, splits). Each block writes its
// slice of the output tile (epilogue_pair_or_partial), then splitk_fixup:
// every thread fences its stores, and one thread counts the block in
// counters[tile] (one int32 per output tile, zero between launches). The
// block that brings the count to `splits` sums all slices of the tile in
// slice order 0, 1, ... (so the result does not depend on which block came
// last), applies the epilogue, 8 channels per thread, and puts the counter
// back to zero for the next launch. No second kernel, no launch between the
// GEMM and its reduction. THREADS: the threads that take part (all of the
// block, or a warp-specialised kernel's consumers, tid 0 .. THREADS-1).
template <int THREADS>
__device__ __forceinline__ void splitk_barrier() {
    asm volatile("bar.sync 1, %0;\n" :: "n"(THREADS) : "memory");
}

// v[0..7] (bias already in) += the slices of partial[splits][M][K] at `off`; read at L2 (.cg): the slices
// of the other blocks were written from other SMs.
__device__ __forceinline__ void splitk_add_slices(float (&v)[8], const float *__restrict__ partial, int splits,
                                                  u64 slice, u64 off) {
    for (int s = 0; s < splits; ++s) {
        const float *p = partial + (u64)s * slice + off;
        float4 p0, p1;
        asm volatile("ld.global.cg.v4.f32 {%0,%1,%2,%3}, [%4];\n"
                     : "=f"(p0.x), "=f"(p0.y), "=f"(p0.z), "=f"(p0.w) : "l"(p));
        asm volatile("ld.global.cg.v4.f32 {%0,%1,%2,%3}, [%4];\n"
                     : "=f"(p1.x), "=f"(p1.y), "=f"(p1.z), "=f"(p1.w) : "l"(p + 4));
        v[0] += p0.x; v[1] += p0.y; v[2] += p0.z; v[3] += p0.w; v[4] += p1.x; v[5] += p1.y; v[6] += p1.z; v[7] += p1.w;
    }
}

template <int BM, int BN, int THREADS>
__device__ __forceinline__ void splitk_fixup(const float *__restrict__ partial, int *__restrict__ counters,
                                             int m0, int n0, int M, int K, const float *__restrict__ bias,
                                             const half_bits *__restrict__ residual, half_bits *__restrict__ y,
                                             int relu) {
    __shared__ int last;
    const int tid = threadIdx.x;
    __threadfence();                  // this thread's slice stores, before the count
    splitk_barrier<THREADS>();
    if (tid == 0) {
        const int tile = blockIdx.y * gridDim.x + blockIdx.x;
        last = atomicAdd(counters + tile, 1) == (int)gridDim.z - 1;
        if (last) counters[tile] = 0;   // every block of the tile has counted: ready for the next launch
    }
    splitk_barrier<THREADS>();
    if (!last) return;
    __threadfence();                  // the other blocks' slices, after their counts
    constexpr int GROUPS = BN / 8;
    for (int i = tid; i < BM * GROUPS; i += THREADS) {
        const int m = m0 + i / GROUPS, k = n0 + (i % GROUPS) * 8;
        if (m >= M || k >= K) continue;
        const u64 off = (u64)m * K + k;
        float v[8];
        const float4 b0 = *reinterpret_cast<const float4 *>(bias + k);
        const float4 b1 = *reinterpret_cast<const float4 *>(bias + k + 4);
        v[0] = b0.x; v[1] = b0.y; v[2] = b0.z; v[3] = b0.w; v[4] = b1.x; v[5] = b1.y; v[6] = b1.z; v[7] = b1.w;
        splitk_add_slices(v, partial, gridDim.z, (u64)M * K, off);
        epilogue_store8(v, off, residual, y, relu);
    }
}
#endif  // FUSEDRESNET_EPILOGUE_CUH
