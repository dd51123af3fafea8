// The b1 tensor-core building blocks shared by binary_linear.cu and the conv kernels (conv_common.cuh): mma.sync
// m16n8k256 AND.POPC, vector global loads, cp.async and one shared-memory stage of MMAs (sm_80+).
#pragma once

#include "device_common.cuh"

namespace bitcompile {
namespace cuda {

constexpr int kMmaStageWords = 16;  // 512 bits of K per shared-memory stage (two k256 MMA steps)
constexpr int kMmaRowStride = 24;   // words per shared row: 16 + 8 padding, see fragment loads below

// D = popc(A & B) + C on a 16x8 tile, 256 bits of K (PTX ISA: mma, .b1 with .and.popc).
__device__ __forceinline__ void mma_and_popc(int (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k256.row.col.s32.b1.b1.s32.and.popc "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// One global load of VW consecutive words (VW = 4: 16-byte loads, needs words % 4 == 0 and aligned bases).
template <int VW>
struct Words;
template <>
struct Words<1> {
  uint32_t v;
  __device__ __forceinline__ void load(const uint32_t* p) { v = __ldg(p); }
  __device__ __forceinline__ void zero() { v = 0; }
  __device__ __forceinline__ void mask_tail(int64_t first_word, int64_t words, uint32_t last_bits) {
    if (first_word == words - 1) v &= last_bits;
  }
  __device__ __forceinline__ void store(uint32_t* p) const { *p = v; }
  __device__ __forceinline__ void set(const uint32_t (&bits)[1]) { v = bits[0]; }
  __device__ __forceinline__ void invert_within(const uint32_t (&bits)[1]) { v = ~v & bits[0]; }
};
template <>
struct Words<4> {
  uint4 v;
  __device__ __forceinline__ void load(const uint32_t* p) { v = __ldg(reinterpret_cast<const uint4*>(p)); }
  __device__ __forceinline__ void zero() { v = make_uint4(0, 0, 0, 0); }
  __device__ __forceinline__ void mask_tail(int64_t first_word, int64_t words, uint32_t last_bits) {
    if (first_word + 3 == words - 1) v.w &= last_bits;  // words % 4 == 0: the last word is a .w
  }
  __device__ __forceinline__ void store(uint32_t* p) const { *reinterpret_cast<uint4*>(p) = v; }
  __device__ __forceinline__ void set(const uint32_t (&bits)[4]) { v = make_uint4(bits[0], bits[1], bits[2], bits[3]); }
  __device__ __forceinline__ void invert_within(const uint32_t (&bits)[4]) {
    v = make_uint4(~v.x & bits[0], ~v.y & bits[1], ~v.z & bits[2], ~v.w & bits[3]);
  }
};

constexpr int kPipeStages = 4;  // cp.async stages in flight in the pipelined kernels

__device__ __forceinline__ void cp_async_16(uint32_t* shared_dst, const uint32_t* global_src, bool fill) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared_dst));
  const int src_bytes = fill ? 16 : 0;  // 0: the 16 bytes are zero-filled, nothing is read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global_src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
}

// One shared-memory stage (kMmaStageWords words of K, rows kMmaRowStride words apart) through the b1
// tensor cores, for the pipelined kernels: this warp's MT x NT tiles, A from the MT * 16 rows at a_warp,
// B from the NT * 8 rows at b_warp. Fragment words as in binary_linear_mma_kernel: (a0, a2) row g,
// (a1, a3) row g + 8, (b0, b1) column g, words 2t and 2t + 1 of each 8-word step.
template <int MT, int NT>
__device__ __forceinline__ void mma_shared_stage(int (&acc)[MT][NT][4], const uint32_t* a_warp,
                                                 const uint32_t* b_warp, int group, int thread_in_group) {
#pragma unroll
  for (int step = 0; step < kMmaStageWords / 8; ++step) {
    const int word = step * 8 + 2 * thread_in_group;
    uint32_t a_frag[MT][4];
    uint32_t b_frag[NT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int row = mt * 16 + group;
      const uint2 top = *reinterpret_cast<const uint2*>(&a_warp[row * kMmaRowStride + word]);
      const uint2 bottom = *reinterpret_cast<const uint2*>(&a_warp[(row + 8) * kMmaRowStride + word]);
      a_frag[mt][0] = top.x;
      a_frag[mt][1] = bottom.x;
      a_frag[mt][2] = top.y;
      a_frag[mt][3] = bottom.y;
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const uint2 pair = *reinterpret_cast<const uint2*>(&b_warp[(nt * 8 + group) * kMmaRowStride + word]);
      b_frag[nt][0] = pair.x;
      b_frag[nt][1] = pair.y;
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma_and_popc(acc[mt][nt], a_frag[mt], b_frag[nt]);
    }
  }
}

}  // namespace cuda
}  // namespace bitcompile
