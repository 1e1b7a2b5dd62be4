// The fused epilogue of every convolution kernel, per output element, fp32:
//     v = acc + bias[k]            (the folded BatchNorm)
//     v += residual[m, k]          (the block's identity, when residual != nullptr)
//     v = max(v, 0)                (when relu)
//     y[m, k] = fp16(v)            (NHWC: row m = output pixel, K contiguous channels)
// or, for one slice of a split-K reduction, the raw fp32 sums into
// partial[slice][m][k] (splitk_epilogue in conv_implicit_gemm.cu adds the
// slices and applies the epilogue above).
//
// Two granularities: a pair of adjacent channels straight from the
// accumulator fragments (thread (g = lane/4, t = lane%4) of an m16n8 tile
// holds rows g and g+8, columns 2t and 2t+1; the wgmma accumulators repeat
// that layout), and 8 channels (16 bytes of output) per thread where the
// values were gathered first (splitk_epilogue, the shared-memory epilogue of
// conv3x3_patch).
#ifndef FUSEDRESNET_EPILOGUE_CUH
#define FUSEDRESNET_EPILOGUE_CUH
#include "common.cuh"

// Channels k, k+1 of the element at offset `off` (= m*K + k) of y / residual, v0 and v1 with the bias
// already added (epilogue_pair adds it).
__device__ __forceinline__ void epilogue_pair_biased(float v0, float v1, u64 off,
                                                     const half_bits *__restrict__ residual,
                                                     half_bits *__restrict__ y, int relu) {
    if (residual != nullptr) {
        float r0, r1;
        unpack_half2(*reinterpret_cast<const half2_bits *>(residual + off), r0, r1);
        v0 += r0; v1 += r1;
    }
    if (relu) { v0 = fmaxf(v0, 0.f); v1 = fmaxf(v1, 0.f); }
    *reinterpret_cast<half2_bits *>(y + off) = pack_half2(v0, v1);
}

// Both fragment rows of one m16 block (rows g and g+8: offsets row[0], row[1] of their channel 0, each
// written only where valid[h]) over NJ column pairs k = k0 + 8j, k0 + 8j + 1 (those with k < K), from
// the accumulators acc[4j + 2h], acc[4j + 2h + 1] plus bias_pair(j) (the two bias values), in two
// steps: epilogue_load_residual_rows issues the residual loads of both rows (zeros without a
// residual), epilogue_store_rows adds them (ADD_RESIDUAL) and stores (CHECK_K: skips the pairs with
// k >= K; a caller whose tile never crosses K passes false). epilogue_rows does both at once: one wait on
// memory per m16 block, not one per fragment row (the residual of a large batch comes from HBM, about a
// microsecond away under load); it holds 2 * NJ more registers than pair by pair (conv_wgmma.cu says
// where it pays). conv3x3_patch_wgmma issues the loads one tile ahead of the stores (its tiles with
// one m64 block per warpgroup).
template <int NJ>
__device__ __forceinline__ void epilogue_load_residual_rows(half2_bits (&res)[2][NJ], const u64 (&row)[2],
                                                            const bool (&valid)[2], int k0, int K,
                                                            const half_bits *__restrict__ residual) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
            res[h][j] = residual != nullptr && valid[h] && k0 + 8 * j < K
                ? *reinterpret_cast<const half2_bits *>(residual + row[h] + k0 + 8 * j) : 0u;
}

template <int NJ, bool ADD_RESIDUAL, bool CHECK_K, typename BiasPair>
__device__ __forceinline__ void epilogue_store_rows(const float *acc, BiasPair bias_pair,
                                                    const half2_bits (&res)[2][NJ], const u64 (&row)[2],
                                                    const bool (&valid)[2], int k0, int K,
                                                    half_bits *__restrict__ y, int relu) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        if (!valid[h]) continue;
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            if (CHECK_K && k0 + 8 * j >= K) continue;
            const float2 b = bias_pair(j);
            float v0 = acc[4 * j + 2 * h] + b.x, v1 = acc[4 * j + 2 * h + 1] + b.y;
            if constexpr (ADD_RESIDUAL) {
                float r0, r1;
                unpack_half2(res[h][j], r0, r1);
                v0 += r0; v1 += r1;
            }
            if (relu) { v0 = fmaxf(v0, 0.f); v1 = fmaxf(v1, 0.f); }
            *reinterpret_cast<half2_bits *>(y + row[h] + k0 + 8 * j) = pack_half2(v0, v1);
        }
    }
}

template <int NJ, typename BiasPair>
__device__ __forceinline__ void epilogue_rows(const float *acc, BiasPair bias_pair, const u64 (&row)[2],
                                              const bool (&valid)[2], int k0, int K,
                                              const half_bits *__restrict__ residual, half_bits *__restrict__ y,
                                              int relu) {
    half2_bits res[2][NJ];
    epilogue_load_residual_rows<NJ>(res, row, valid, k0, K, residual);
    epilogue_store_rows<NJ, true, true>(acc, bias_pair, res, row, valid, k0, K, y, relu);   // zeros without one
}

// Four fragment words of one row, words[c] = channels 8c + 2t, +1 of a 32-channel block (t = lane % 4), as
// 16 contiguous bytes per lane: the quad's lanes trade them (common.cuh quad_transpose4) and lane t stores
// channels 8t .. 8t+7 at block + 8t where valid (the same for the quad's 4 lanes; every lane takes part in
// the shuffles). One request per row and block instead of four 4-byte ones (NOTES.md, outcomes 43-44).
__device__ __forceinline__ void epilogue_store16(const unsigned int *words, int t, half_bits *__restrict__ block,
                                                 bool valid) {
    unsigned int q[4] = {words[0], words[1], words[2], words[3]};
    quad_transpose4(q, t);
    vec16 out;
    out.x = q[0]; out.y = q[1]; out.z = q[2]; out.w = q[3];
    if (valid) *reinterpret_cast<vec16 *>(block + 8 * t) = out;
}

// The same from the raw sums: adds bias[k], bias[k+1] first.
__device__ __forceinline__ void epilogue_pair(float v0, float v1, int k, u64 off, const float *__restrict__ bias,
                                              const half_bits *__restrict__ residual, half_bits *__restrict__ y,
                                              int relu) {
    epilogue_pair_biased(v0 + bias[k], v1 + bias[k + 1], off, residual, y, relu);
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
// residual r (loaded by the caller: wgmma_cluster_splitk_epilogue issues it
// early) when add_residual, applies ReLU and stores 16 bytes.
__device__ __forceinline__ void epilogue_store8_loaded(float (&v)[8], const vec16 &r, bool add_residual, u64 off,
                                                       half_bits *__restrict__ y, int relu) {
    if (add_residual) {
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

// The same with the residual (if any) loaded here.
__device__ __forceinline__ void epilogue_store8(float (&v)[8], u64 off, const half_bits *__restrict__ residual,
                                                half_bits *__restrict__ y, int relu) {
    vec16 r = {0u, 0u, 0u, 0u};
    if (residual != nullptr) r = *reinterpret_cast<const vec16 *>(residual + off);
    epilogue_store8_loaded(v, r, residual != nullptr, off, y, relu);
}
#endif  // FUSEDRESNET_EPILOGUE_CUH
