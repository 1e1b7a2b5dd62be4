// The two non-convolution stages of ResNet-18, NHWC fp16.
//
// maxpool_3x3s2: 3x3 window, stride 2, padding 1 (the stem's pool). One thread
// produces 8 channels (16 bytes) of one output pixel with packed fp16 max, so
// loads and stores are 16 bytes wide and coalesced along the channels.
// Padding never wins: every window holds at least one real pixel.
//
// avgpool_fc: global average pool + fully-connected layer in one kernel, fp32
// logits out. A block takes IMGS images and a slice of the classes: it first
// averages the images' HxW feature maps into shared memory (fp32), then each
// warp computes dot products of fp16 weight rows (read once per IMGS images)
// with those features, reduced across the warp with shuffles.

#include "common.cuh"

__global__ void __launch_bounds__(EW_THREADS)
maxpool_3x3s2(const half_bits *__restrict__ x, half_bits *__restrict__ y, int N, int H, int W, int C, int P, int Q) {
    pdl_begin();   // common.cuh: before any global access
    const int groups = C / 8;
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)N * P * Q * groups) return;
    const int gidx = (int)(idx % groups);
    long long pix = idx / groups;
    const int q = (int)(pix % Q); pix /= Q;
    const int p = (int)(pix % P);
    const int n = (int)(pix / P);
    const unsigned int NEG_INF2 = 0xfc00fc00u;
    unsigned int m[4] = {NEG_INF2, NEG_INF2, NEG_INF2, NEG_INF2};
#pragma unroll
    for (int r = 0; r < 3; ++r) {
        const int ih = p * 2 - 1 + r;
        if ((unsigned)ih >= (unsigned)H) continue;
#pragma unroll
        for (int s = 0; s < 3; ++s) {
            const int iw = q * 2 - 1 + s;
            if ((unsigned)iw >= (unsigned)W) continue;
            const vec16 v = *reinterpret_cast<const vec16 *>(x + (((u64)n * H + ih) * W + iw) * C + gidx * 8);
            m[0] = hmax2(m[0], v.x); m[1] = hmax2(m[1], v.y); m[2] = hmax2(m[2], v.z); m[3] = hmax2(m[3], v.w);
        }
    }
    vec16 out; out.x = m[0]; out.y = m[1]; out.z = m[2]; out.w = m[3];
    *reinterpret_cast<vec16 *>(y + (((u64)n * P + p) * Q + q) * C + gidx * 8) = out;
}

// Requires C == 512 (features per image) and HEAD_THREADS threads.
template <int IMGS>
__global__ void __launch_bounds__(HEAD_THREADS)
avgpool_fc(const half_bits *__restrict__ x, const half_bits *__restrict__ w, const float *__restrict__ b,
           float *__restrict__ logits, int N, int HW, int classes, int classes_per_block) {
    pdl_begin_prefetch_l2(w + (u64)blockIdx.x * classes_per_block * 512,   // common.cuh: this block's fc rows
                          blockIdx.y == 0 ? min(classes_per_block, classes - (int)blockIdx.x * classes_per_block) : 0,
                          512 * 2, 512 * 2);
    constexpr int C = 512;
    __shared__ __align__(16) float feat[IMGS][C];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int img0 = blockIdx.y * IMGS;

    // Pool: thread handles one 8-channel group of one image per pass.
    const float inv = 1.f / (float)HW;
    for (int job = tid; job < IMGS * (C / 8); job += HEAD_THREADS) {
        const int i = job / (C / 8), g8 = job % (C / 8);
        float s[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        if (img0 + i < N) {
            const half_bits *src = x + (u64)(img0 + i) * HW * C + g8 * 8;
            for (int hw = 0; hw < HW; ++hw) {
                const vec16 v = *reinterpret_cast<const vec16 *>(src + (u64)hw * C);
                const unsigned int vv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    float lo, hi;
                    unpack_half2(vv[j], lo, hi);
                    s[2 * j] += lo; s[2 * j + 1] += hi;
                }
            }
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) feat[i][g8 * 8 + j] = s[j] * inv;
    }
    __syncthreads();

    // FC: each warp takes classes; lane covers channels [lane*8, lane*8+8) and [256+lane*8, ...).
    const int cls_begin = blockIdx.x * classes_per_block;
    const int cls_end = min(classes, cls_begin + classes_per_block);
    for (int cls = cls_begin + warp; cls < cls_end; cls += HEAD_THREADS / 32) {
        float wv[16];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const vec16 v = *reinterpret_cast<const vec16 *>(w + (u64)cls * C + h * 256 + lane * 8);
            const unsigned int vv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 4; ++j) unpack_half2(vv[j], wv[h * 8 + 2 * j], wv[h * 8 + 2 * j + 1]);
        }
        float dot[IMGS];
#pragma unroll
        for (int i = 0; i < IMGS; ++i) {
            float s = 0.f;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float4 f0 = *reinterpret_cast<const float4 *>(&feat[i][h * 256 + lane * 8]);
                const float4 f1 = *reinterpret_cast<const float4 *>(&feat[i][h * 256 + lane * 8 + 4]);
                s += f0.x * wv[h * 8 + 0] + f0.y * wv[h * 8 + 1] + f0.z * wv[h * 8 + 2] + f0.w * wv[h * 8 + 3]
                   + f1.x * wv[h * 8 + 4] + f1.y * wv[h * 8 + 5] + f1.z * wv[h * 8 + 6] + f1.w * wv[h * 8 + 7];
            }
            dot[i] = s;
        }
#pragma unroll
        for (int i = 0; i < IMGS; ++i) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) dot[i] += __shfl_xor_sync(0xffffffffu, dot[i], o);
        }
        if (lane == 0) {
            const float bias = b[cls];
#pragma unroll
            for (int i = 0; i < IMGS; ++i)
                if (img0 + i < N) logits[(u64)(img0 + i) * classes + cls] = dot[i] + bias;
        }
    }
}
