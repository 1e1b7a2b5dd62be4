// PTX wrappers of the Hopper warpgroup MMA (sm_90a only: build.source_text
// pastes this header for that target alone), shared by conv_wgmma.cu and
// stem_wgmma.cu: the shared-memory matrix descriptor of a 128B-swizzled
// K-major tile, wgmma.mma_async with both operands from shared memory
// (wgmma_m64k16<N>) or A from registers (wgmma_m64n64k16_rs), and the fences
// and waits around them. How the tiles and descriptors are laid out:
// conv_wgmma.cu's header.
#ifndef FUSEDRESNET_WGMMA_CUH
#define FUSEDRESNET_WGMMA_CUH
#include "common.cuh"

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

// threadIdx.x / 128 as a value the compiler knows is the same across the warp (a shuffle from lane 0,
// as CUTLASS's canonical_warp_group_idx): the descriptors derived from it are then built in uniform
// registers, where wgmma takes them, instead of 64-bit arithmetic and R2UR moves before every wgmma.
__device__ __forceinline__ int warpgroup_index() {
    return __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0);
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

// D[64 x 64] += A[64 x 16] * B[64 x 16]^T with A from registers: a[0..3] is
// this thread's m16n8k16-style A fragment of its warp's 16 rows (warp w of the
// warpgroup: rows 16w .. 16w+15; a0 = row g, k 2t..2t+1; a1 = row g+8; a2, a3 =
// the same rows at k + 8), B K-major in shared memory (descriptor).
__device__ __forceinline__ void wgmma_m64n64k16_rs(float *d, const unsigned int (&a)[4], u64 desc_b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                 "{" WGMMA_REGS_32 "}, {%32, %33, %34, %35}, %36, 1, 1, 1, 0;\n"
                 : WGMMA_ACC_32(0) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}
#undef WGMMA_M64K16

// mbarriers in shared memory (PTX ISA, "Parallel Synchronization and
// Communication Instructions: mbarrier"), for conv_wgmma_ws's producer /
// consumer ring. `bar` is the shared-memory byte address of an 8-byte aligned
// u64. A barrier completes a phase when `count` arrivals have been made since
// the previous completion; waiters name the phase by its parity (0, 1, 0, ...).
__device__ __forceinline__ void mbarrier_init(unsigned int bar, unsigned int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}
// Makes the mbarrier.init of this thread visible before any other thread's
// arrive or wait (followed by __syncthreads in the kernel).
__device__ __forceinline__ void fence_mbarrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival (release semantics: this thread's earlier memory accesses, and the
// completed wgmma reads it waited for, are ordered before it).
__device__ __forceinline__ void mbarrier_arrive(unsigned int bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
// One arrival once every cp.async this thread issued so far has landed. .noinc:
// the arrival counts against the barrier's initial count (one per issuing thread).
__device__ __forceinline__ void cp_async_mbarrier_arrive_noinc(unsigned int bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" :: "r"(bar) : "memory");
}
// Spins until the phase of parity `parity` has completed (acquire semantics).
// A barrier whose current, incomplete phase has the other parity counts the
// previous phase as completed (conv_wgmma_ws does not rely on it: its producer
// skips the empty-barrier wait on its first pass over the ring).
__device__ __forceinline__ void mbarrier_wait_parity(unsigned int bar, unsigned int parity) {
    asm volatile("{\n"
                 "  .reg .pred done;\n"
                 "MBARRIER_WAIT:\n"
                 "  mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "  @!done bra MBARRIER_WAIT;\n"
                 "}\n" :: "r"(bar), "r"(parity) : "memory");
}
// TMA, the Hopper tensor memory accelerator (PTX ISA, "cp.async.bulk.tensor"), for conv_wgmma_tma: one
// thread asks for a whole tile, which lands in shared memory in the 128-byte swizzle and completes
// `bytes` of an mbarrier's expected transaction count. The tensor map (CUtensorMap) that says how to
// walk global memory is encoded on the host (cuTensorMapEncodeIm2col / Tiled, kernels/launch.py) and
// passed by value as a __grid_constant__ kernel parameter; the instructions take its generic address.
struct alignas(64) TmaDescriptor {
    unsigned long long opaque[16];
};
__device__ __forceinline__ u64 tma_descriptor_addr(const TmaDescriptor &desc) {
    return reinterpret_cast<u64>(&desc);
}
__device__ __forceinline__ void tma_prefetch_descriptor(const TmaDescriptor &desc) {
    asm volatile("prefetch.tensormap [%0];\n" :: "l"(tma_descriptor_addr(desc)) : "memory");
}
// This thread's arrival on `bar`, which also raises the phase's expected transaction count by `bytes`
// (the tiles the TMA loads will deliver).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(unsigned int bar, unsigned int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(bar), "r"(bytes) : "memory");
}
// im2col mode over an NHWC tensor (the map's dims {C, W, H, N}): pixelsPerColumn consecutive output
// positions from the one whose filter window starts at input (w, h) of image n (the map's element
// strides are the convolution's; past a row's, an image's or the batch's end the walk goes on to the
// next, and pixels outside the tensor read as zeros), each its channelsPerPixel channels from c at
// filter offset (off_w, off_h) = (s, r).
__device__ __forceinline__ void tma_load_im2col_4d(unsigned int dst, const TmaDescriptor &desc, int c, int w, int h,
                                                   int n, unsigned short off_w, unsigned short off_h,
                                                   unsigned int bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6], {%7, %8};\n"
                 :: "r"(dst), "l"(tma_descriptor_addr(desc)), "r"(c), "r"(w), "r"(h), "r"(n), "r"(bar),
                    "h"(off_w), "h"(off_h) : "memory");
}
// Tiled mode over a 2-D tensor: the box at (x0 innermost, x1); rows past the tensor read as zeros.
__device__ __forceinline__ void tma_load_2d(unsigned int dst, const TmaDescriptor &desc, int x0, int x1,
                                            unsigned int bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n"
                 :: "r"(dst), "l"(tma_descriptor_addr(desc)), "r"(x0), "r"(x1), "r"(bar) : "memory");
}
// Thread-block clusters (sm_90): the cluster barrier (release / acquire: this block's shared-memory
// writes before it are visible to every block of the cluster after it), this block's rank and the
// cluster's size, a shared-memory address of this block mapped to the same offset in block `rank`,
// and a 16-byte load through such an address (distributed shared memory).
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ unsigned int cluster_block_rank() {
    unsigned int r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ unsigned int cluster_num_blocks() {
    unsigned int r;
    asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ unsigned int cluster_map_shared(unsigned int smem_byte_addr, int rank) {
    unsigned int r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(smem_byte_addr), "r"(rank));
    return r;
}
__device__ __forceinline__ float4 ld_shared_cluster_f4(unsigned int cluster_addr) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(cluster_addr) : "memory");
    return v;
}
#endif  // FUSEDRESNET_WGMMA_CUH
