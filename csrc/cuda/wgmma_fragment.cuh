// Sign bits -> the A register fragment of wgmma.mma_async.m64nNk16 (.bf16 / .f16, A from registers), shared
// by the kernel (binary_weight_wgmma.cu) and its host-side check (benchmarks/kernels/wgmma_fragment_check.cpp).
// Plain C++ with __host__ __device__ under nvcc, so that g++ compiles the check without CUDA.
//
// PTX ISA, "Matrix Fragments for wgmma.mma_async.m64nNk16" (figure wgmma-64N16-A): warp w of the warpgroup holds
// rows 16w..16w+15 of A (64 x 16); within the warp it is the mma.sync m16n8k16 A layout. Lane l, g = l >> 2,
// t = l & 3, holds 4 .b32 registers of 2 elements each (element e = 0..7, the lower 16 bits first):
//   row = 16w + g + 8 * ((e >> 1) & 1),   col (k) = 8 * (e >> 2) + 2t + (e & 1)
//   reg0 = {A[g][2t], A[g][2t+1]}        reg1 = {A[g+8][2t], A[g+8][2t+1]}
//   reg2 = {A[g][8+2t], A[g][8+2t+1]}    reg3 = {A[g+8][8+2t], A[g+8][8+2t+1]}
//
// Here A's rows are output features, k natural (no permutation: the x tile in shared memory is in natural k
// order too). One packed word covers 32 k = two k16 steps; within a word, "chunk" c = 0..3 is bits 8c..8c+7
// (k 8c..8c+7), so k16 step s of the word uses chunk 2s (reg0 / reg1) and chunk 2s + 1 (reg2 / reg3), and
// lane t needs bits 8c + 2t (low half) and 8c + 2t + 1 (high half) of chunk c.
//
// Expansion: per word and lane, lo = word >> 2t and hi = word >> (16 + 2t) (2 shifts, done once a word); then per
// register (chunk c, src = c < 2 ? lo : hi, s = 8 (c & 1)):
//   p = src & (3 << s)                     bits b0 (at s) and b1 (at s + 1), nothing else
//   p *= 2^(15 - s) + 2^(30 - s)           b0 -> bits 15 and 30, b1 -> bits 16 and 31 (no carries: distinct bits)
//   reg = (p & 0x80008000) ^ minus_one     sign bits; minus_one = -1.0 in both halves, so bit 1 -> +1.0
// i.e. 3 integer ops a register (LOP3, IMAD, LOP3) + 0.5 for the shifts. (The unzip variant, even bits to the low
// half, costs 8+ ops a word a lane and saves nothing unless one thread unzips a word for the whole quad.)
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define BC_HD __host__ __device__ __forceinline__
#else
#define BC_HD inline
#endif

namespace bitcompile {
namespace wgmma_frag {

constexpr uint32_t kMinusOneBf16 = 0xBF80BF80u;  // bf16 -1.0 twice; ^ 0x8000 gives +1.0 (0x3F80)
constexpr uint32_t kMinusOneF16 = 0xBC00BC00u;   // fp16 -1.0 twice; ^ 0x8000 gives +1.0 (0x3C00)

// The register of chunk C (0..3) of a word, from lo = word >> 2t, hi = word >> (16 + 2t).
template <int C>
BC_HD uint32_t chunk_register(uint32_t lo, uint32_t hi, uint32_t minus_one) {
  constexpr int s = 8 * (C & 1);
  const uint32_t src = C < 2 ? lo : hi;
  uint32_t p = src & (3u << s);
  p *= (1u << (15 - s)) + (1u << (30 - s));
  return (p & 0x80008000u) ^ minus_one;
}

// The 4 registers of k16 step S (0 or 1) of a pair of words: w_g = the word of row g, w_g8 = row g + 8, both
// already split as (lo, hi) for this lane's t.
template <int S>
BC_HD void step_registers(uint32_t lo_g, uint32_t hi_g, uint32_t lo_g8, uint32_t hi_g8, uint32_t minus_one,
                          uint32_t (&a)[4]) {
  a[0] = chunk_register<2 * S>(lo_g, hi_g, minus_one);
  a[1] = chunk_register<2 * S>(lo_g8, hi_g8, minus_one);
  a[2] = chunk_register<2 * S + 1>(lo_g, hi_g, minus_one);
  a[3] = chunk_register<2 * S + 1>(lo_g8, hi_g8, minus_one);
}

BC_HD uint32_t split_lo(uint32_t word, int t) { return word >> (2 * t); }
BC_HD uint32_t split_hi(uint32_t word, int t) { return word >> (16 + 2 * t); }

}  // namespace wgmma_frag
}  // namespace bitcompile
