// 4-bit APoT codes -> the A register fragment of wgmma.mma_async.m64nNk16 (.bf16 / .f16, A from registers), shared
// by the kernel (apot_wgmma.cu) and its host-side check (benchmarks/kernels/apot_fragment_check.cpp). Plain C++ with
// __host__ __device__ under nvcc, so that g++ compiles the check without CUDA (prmt emulated on the host).
//
// Fragment map (PTX ISA "Matrix Fragments for wgmma.mma_async.m64nNk16", as in wgmma_fragment.cuh): lane l,
// g = l >> 2, t = l & 3, of warp w holds rows 16w + g (reg0, reg2) and 16w + g + 8 (reg1, reg3) of the 64 x 16 A
// step, k 2t, 2t+1 (reg0 / reg1) and 8+2t, 8+2t+1 (reg2 / reg3), the lower k in the low 16 bits.
//
// Codes (pack_codes, bits <= 4): two a byte along K, element 2j in the low nibble. A row's 16 codes of a k16 step are
// 8 bytes = two words w0 (k 0..7) and w1 (k 8..15); byte t of w0 holds exactly the codes of k 2t (low nibble) and
// 2t+1 (high nibble): reg0 / reg1; byte t of w1 those of reg2 / reg3.
//
// Expansion of one row's pair of registers (reg0 + reg2, or reg1 + reg3), 12 instructions (6 a register):
//   c   = prmt(w0, w1, t | (4 + t) << 4)   gather: the 4 codes in nibbles 0..3 (k 2t, 2t+1, 8+2t, 9+2t)
//   s   = c & 0x7777                       3-bit selectors: entry (code & 7) of a half table
//   h   = ((c >> 1) & 0x4444) | 0x3210     per byte i: i (code < 8) or 4 + i (code >= 8)
//   la  = prmt(lo[0], lo[1], s)            low bytes of entries 0..7 for the 4 codes
//   lb  = prmt(lo[2], lo[3], s)            low bytes of entries 8..15
//   lo  = prmt(la, lb, h)                  the low byte of each code's entry
//   hi  = the same from the high-byte tables (2 lookups, 1 pick)
//   reg0 = prmt(lo, hi, 0x5140), reg2 = prmt(lo, hi, 0x7362)   interleave: {entry(k 2t), entry(k 2t+1)} ...
// The table: the 16 entries as 16-bit values of x's type (entries past 2^bits are 0: a code outside the table reads
// as level 0), low bytes in lo[0..3] (entry 4i + b in byte b of lo[i]), high bytes in hi[0..3]. No selector nibble
// has bit 3 set (prmt's sign-replicate mode is never used).
#pragma once

#include <math.h>

#include <cstdint>

#if defined(__CUDACC__)
#define BC_AF_HD __host__ __device__ __forceinline__
#else
#define BC_AF_HD inline
#endif

namespace bitcompile {
namespace apot_frag {

// prmt.b32 d, a, b, s in its default mode for selectors whose nibbles are all 0..7: byte i of d = byte (s >> 4i) & 7
// of the 8 bytes {b:a}.
BC_AF_HD uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(s));
  return d;
#else
  const uint64_t both = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t d = 0;
  for (int i = 0; i < 4; ++i) {
    const unsigned nibble = (s >> (4 * i)) & 15u;
    uint32_t byte = static_cast<uint32_t>(both >> (8 * (nibble & 7u))) & 0xffu;
    if (nibble & 8u) byte = (byte & 0x80u) ? 0xffu : 0u;  // sign replicate (never asked for here)
    d |= byte << (8 * i);
  }
  return d;
#endif
}

// The 16-entry table split into byte planes (see above).
struct Table {
  uint32_t lo[4], hi[4];
};

// entries: 16 values as 16-bit patterns of x's type.
BC_AF_HD Table make_table(const uint16_t (&entries)[16]) {
  Table table{};
  for (int e = 0; e < 16; ++e) {
    table.lo[e >> 2] |= static_cast<uint32_t>(entries[e] & 0xffu) << (8 * (e & 3));
    table.hi[e >> 2] |= static_cast<uint32_t>(entries[e] >> 8) << (8 * (e & 3));
  }
  return table;
}

// How the table's values enter the MMA (x's type T holds them), and what the accumulators are multiplied by after.
//   integral: every value is a small integer multiple N_e of one base (the APoT schemes: each level is alpha / D * N
//     with an integer N, SPEC 2.5; apot4's normalized levels are multiples of 0.1, NOT dyadic): the MMA takes N_e,
//     exact in T while |N_e| <= max_integer (bf16 256, fp16 2048), and the accumulators get base: exact products and
//     fp32 sums, as the fp32 kernels. base = the smallest nonzero |value|; N_e = rint(value / base), kept when
//     |N_e base - value| <= 2^-20 |value| for every entry.
//   otherwise (any other table): value * 2^-e with 2^e the power of two that brings the largest |value| into [1, 2)
//     (levels near 1e-20 would leave fp16's range), rounded to T by the caller, and the accumulators get 2^e: T's
//     rounding of each entry (a relative 2^-9 for bf16), the rounding class of the dequantize + cuBLAS path.
struct TablePlan {
  bool integral;
  float unscale;     // what the accumulators are multiplied by
  float scaled[16];  // integral: the integers N_e; otherwise value * 2^-e, still to be rounded to T
};

BC_AF_HD TablePlan plan_table(const float (&values)[16], float max_integer) {
  TablePlan plan{};
  float base = 0.f, largest = 0.f;
  for (int e = 0; e < 16; ++e) {
    const float size = fabsf(values[e]);
    largest = fmaxf(largest, size);
    if (size > 0.f && (base == 0.f || size < base)) base = size;
  }
  bool integral = base > 0.f && largest <= 3.4e38f;  // a zero or non-finite table takes the other path
  for (int e = 0; e < 16 && integral; ++e) {
    const float n = rintf(values[e] / base);
    integral = fabsf(n) <= max_integer && fabsf(n * base - values[e]) <= 9.5367431640625e-7f * fabsf(values[e]);
    plan.scaled[e] = n;
  }
  plan.integral = integral;
  if (integral) {
    plan.unscale = base;
    return plan;
  }
  const int exponent = largest > 0.f && largest <= 3.4e38f ? ilogbf(largest) : 0;
  plan.unscale = ldexpf(1.f, exponent);
  for (int e = 0; e < 16; ++e) plan.scaled[e] = ldexpf(values[e], -exponent);
  return plan;
}

// The selector of the gather for lane t: byte t of w0, byte t of w1.
BC_AF_HD uint32_t gather_selector(int t) { return static_cast<uint32_t>(t) | (static_cast<uint32_t>(4 + t) << 4); }

// One row's two registers of a k16 step: r_lo = k 2t, 2t+1 (reg0 or reg1), r_hi = k 8+2t, 9+2t (reg2 or reg3).
BC_AF_HD void row_registers(uint32_t w0, uint32_t w1, uint32_t gather, const Table& table, uint32_t& r_lo,
                            uint32_t& r_hi) {
  const uint32_t c = prmt(w0, w1, gather);
  const uint32_t s = c & 0x7777u;
  const uint32_t h = ((c >> 1) & 0x4444u) | 0x3210u;
  const uint32_t lo = prmt(prmt(table.lo[0], table.lo[1], s), prmt(table.lo[2], table.lo[3], s), h);
  const uint32_t hi = prmt(prmt(table.hi[0], table.hi[1], s), prmt(table.hi[2], table.hi[3], s), h);
  r_lo = prmt(lo, hi, 0x5140u);
  r_hi = prmt(lo, hi, 0x7362u);
}

// The 4 registers of a k16 step from the step's words of rows g (g0 = k 0..7, g1 = k 8..15) and g + 8 (h0, h1).
BC_AF_HD void step_registers(uint32_t g0, uint32_t g1, uint32_t h0, uint32_t h1, uint32_t gather, const Table& table,
                             uint32_t (&a)[4]) {
  row_registers(g0, g1, gather, table, a[0], a[2]);
  row_registers(h0, h1, gather, table, a[1], a[3]);
}

}  // namespace apot_frag
}  // namespace bitcompile
