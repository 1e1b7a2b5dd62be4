// Device functions of both stem kernel families (stem.cu: mma.sync, every
// target; stem_wgmma.cu: wgmma, sm_90a): the normalised input patch and the
// fused 3x3/2 max-pool of the stem values staged in shared memory. The stem
// itself (layouts, normalisation, why a patch) is explained in stem.cu.
#ifndef FUSEDRESNET_STEM_CUH
#define FUSEDRESNET_STEM_CUH
#include "common.cuh"

// The normalised fp16 input patch of IN_H x IN_W pixels from (iy0, ix0) of
// image n into sIn ([IN_H][IN_ROW] halfs, 3 channels per pixel): UINT8_NHWC
// pixels * scale + shift, FP32_NCHW fp32 values; 0 outside the image.
// BATCHED: each thread first loads all its pixels (ceil(IN_H*IN_W / THREADS),
// their global loads in flight together), then stores them; else one pixel
// at a time (the mma.sync stem kernels, whose other warps cover the latency).
template <StemInput INPUT, int IN_H, int IN_W, int IN_ROW, int THREADS, bool BATCHED = false>
__device__ __forceinline__ void stem_load_patch(half_bits *sIn, const void *__restrict__ x_, const float (&scale)[3],
                                                const float (&shift)[3], int n, int H, int W, int iy0, int ix0,
                                                int tid) {
    auto fetch = [&](int i, float (&v)[3]) {
        const int iy = i / IN_W, ix = i - iy * IN_W;
        const int gy = iy0 + iy, gx = ix0 + ix;
        v[0] = v[1] = v[2] = 0.f;
        if ((unsigned)gy < (unsigned)H && (unsigned)gx < (unsigned)W) {
            if (INPUT == StemInput::UINT8_NHWC) {
                const unsigned char *p = reinterpret_cast<const unsigned char *>(x_) + ((u64)(n * H + gy) * W + gx) * 3;
#pragma unroll
                for (int c = 0; c < 3; ++c) v[c] = (float)p[c] * scale[c] + shift[c];
            } else {
                const float *x = reinterpret_cast<const float *>(x_);
#pragma unroll
                for (int c = 0; c < 3; ++c) v[c] = x[((u64)(n * 3 + c) * H + gy) * W + gx];
            }
        }
    };
    auto put = [&](int i, const float (&v)[3]) {
        const int iy = i / IN_W, ix = i - iy * IN_W;
#pragma unroll
        for (int c = 0; c < 3; ++c) sIn[iy * IN_ROW + ix * 3 + c] = float_to_half(v[c]);
    };
    if constexpr (BATCHED) {
        constexpr int ITERS = (IN_H * IN_W + THREADS - 1) / THREADS;
        float v[ITERS][3];
#pragma unroll
        for (int it = 0; it < ITERS; ++it)
            if (tid + it * THREADS < IN_H * IN_W) fetch(tid + it * THREADS, v[it]);
#pragma unroll
        for (int it = 0; it < ITERS; ++it)
            if (tid + it * THREADS < IN_H * IN_W) put(tid + it * THREADS, v[it]);
    } else {
        for (int i = tid; i < IN_H * IN_W; i += THREADS) {
            float v[3];
            fetch(i, v);
            put(i, v);
        }
    }
}

// The fused max-pool: PH x PW pooled pixels from the (2*PH+1) x (2*PW+1)
// stem pixels staged in `stem` (fp16, C_ROW halfs per pixel, row-major over
// the region, 0 outside the stem map: every pool window holds a real pixel and
// ReLU outputs are >= 0, so 0 never wins and acts as the padding), pooled
// pixel (qy, qx) of the tile = pooled output (py0 + qy, px0 + qx) of image n.
// One job = 8 channels of one pooled pixel: nine 16-byte shared loads, packed
// fp16 max, one 16-byte store (pixels past P2 x Q2 dropped).
template <int PH, int PW, int C_ROW, int THREADS>
__device__ __forceinline__ void stem_pool_store(half_bits *__restrict__ y, const half_bits *stem, int tid, int n,
                                                int py0, int px0, int P2, int Q2) {
    constexpr int SW = 2 * PW + 1, JOBS = PH * PW * 8;
    auto job = [&](int j) {
        const int pix = j >> 3, ch = j & 7;
        const int qy = pix / PW, qx = pix - qy * PW;
        const int oy = py0 + qy, ox = px0 + qx;
        if (oy < P2 && ox < Q2) {
            unsigned int m0 = 0u, m1 = 0u, m2 = 0u, m3 = 0u;   // +0.0: below every ReLU output but equal to 0
#pragma unroll
            for (int dy = 0; dy < 3; ++dy)
#pragma unroll
                for (int dx = 0; dx < 3; ++dx) {
                    const vec16 v =
                        *reinterpret_cast<const vec16 *>(stem + ((2 * qy + dy) * SW + 2 * qx + dx) * C_ROW + ch * 8);
                    m0 = hmax2(m0, v.x); m1 = hmax2(m1, v.y); m2 = hmax2(m2, v.z); m3 = hmax2(m3, v.w);
                }
            vec16 out; out.x = m0; out.y = m1; out.z = m2; out.w = m3;
            *reinterpret_cast<vec16 *>(y + (((u64)n * P2 + oy) * Q2 + ox) * STEM_K + ch * 8) = out;
        }
    };
    if constexpr (JOBS <= THREADS) {
        if (tid < JOBS) job(tid);
    } else {
        for (int j = tid; j < JOBS; j += THREADS) job(j);
    }
}
#endif  // FUSEDRESNET_STEM_CUH
