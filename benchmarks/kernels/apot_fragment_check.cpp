// Host check of the A-fragment expansion of apot_wgmma.cu (csrc/cuda/apot_fragment.cuh) against the PTX ISA
// fragment map of wgmma.mma_async.m64nNk16 with A in registers (figure wgmma-64N16-A):
//   lane l of warp w, g = l >> 2, t = l & 3, element e = 0..7 of its 4 registers (register e >> 1, low half first):
//   row = 16w + g + 8 ((e >> 1) & 1), col = 8 (e >> 2) + 2t + (e & 1)
// For random 4-bit codes of 64 rows x 64 k (pack_codes nibbles: element 2j low, 2j + 1 high) and random 16-entry
// tables of 16-bit patterns (bits 1..4: entries past 2^bits are 0), every lane's registers of the 4 k16 steps must
// hold table[code(row, 16 step + col)]. The emulated prmt is checked against a few hand-computed values first.
// Build and run (no GPU, no CUDA):
//   g++ -std=c++17 -O2 -I csrc benchmarks/kernels/apot_fragment_check.cpp -o /tmp/afrag && /tmp/afrag
#include <cstdint>
#include <cstdio>
#include <random>

#include "cuda/apot_fragment.cuh"

namespace af = bitcompile::apot_frag;

int main() {
  int bad = 0, checked = 0;
  // prmt: {b:a} bytes 0..7 = 0x00..0x77 step 0x11.
  const uint32_t pa = 0x33221100u, pb = 0x77665544u;
  if (af::prmt(pa, pb, 0x3210u) != pa || af::prmt(pa, pb, 0x7654u) != pb || af::prmt(pa, pb, 0x0257u) != 0x00225577u) {
    std::printf("FAIL: prmt emulation\n");
    return 1;
  }
  std::mt19937 random(11);
  for (int trial = 0; trial < 400; ++trial) {
    const int bits = 1 + trial % 4;
    uint16_t entries[16] = {};
    for (int e = 0; e < (1 << bits); ++e) entries[e] = static_cast<uint16_t>(random());
    const af::Table table = af::make_table(entries);
    uint8_t codes[64][64];  // [row][k]; any nibble, as hand-made storage may hold codes past the table
    for (auto& row : codes)
      for (auto& c : row) c = static_cast<uint8_t>(trial == 0 ? 15 : (trial == 1 ? 0 : random() & 15u));
    uint32_t words[64][8];  // row r: word q holds k 8q..8q+7, element 2j in the low nibble of byte j
    for (int r = 0; r < 64; ++r)
      for (int q = 0; q < 8; ++q) {
        words[r][q] = 0;
        for (int j = 0; j < 8; ++j) words[r][q] |= static_cast<uint32_t>(codes[r][8 * q + j]) << (4 * j);
      }
    for (int warp = 0; warp < 4; ++warp)
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane >> 2, t = lane & 3;
        const uint32_t gather = af::gather_selector(t);
        for (int step = 0; step < 4; ++step) {
          uint32_t a[4];
          const uint32_t* wg = words[16 * warp + g];
          const uint32_t* wh = words[16 * warp + g + 8];
          af::step_registers(wg[2 * step], wg[2 * step + 1], wh[2 * step], wh[2 * step + 1], gather, table, a);
          for (int e = 0; e < 8; ++e) {
            const int row = 16 * warp + g + 8 * ((e >> 1) & 1);
            const int k = 16 * step + 8 * (e >> 2) + 2 * t + (e & 1);
            const uint16_t got = static_cast<uint16_t>(a[e >> 1] >> (16 * (e & 1)));
            const uint16_t want = entries[codes[row][k]];
            ++checked;
            if (got != want && bad++ < 10)
              std::printf("MISMATCH bits %d warp %d lane %d step %d e %d: got %04x want %04x\n", bits, warp, lane, step,
                          e, got, want);
          }
        }
      }
  }
  std::printf("%s: %d of %d fragment elements wrong\n", bad == 0 ? "OK" : "FAIL", bad, checked);
  // plan_table: apot4's signed levels (multiples of 0.1f, and the same times 1e-20) are integral with base 0.1 and
  // N = {0, 1, 2, 3, 4, 6, 8, 10} (negated past 8); a table of non-multiples, or one needing |N| > max_integer, is
  // not, and is scaled by the power of two that brings its largest |value| into [1, 2).
  int plan_bad = 0;
  const float magnitudes[8] = {0.f, .1f, .2f, .3f, .4f, .6f, .8f, 1.f};
  const float numerators[8] = {0.f, 1.f, 2.f, 3.f, 4.f, 6.f, 8.f, 10.f};
  for (const float factor : {1.f, 1e-20f}) {
    float values[16];
    for (int e = 0; e < 16; ++e) values[e] = (e & 8 ? -1.f : 1.f) * magnitudes[e & 7] * factor;
    const af::TablePlan plan = af::plan_table(values, 256.f);
    bool ok = plan.integral && plan.unscale == .1f * factor;
    for (int e = 0; e < 16; ++e) ok = ok && plan.scaled[e] == (e & 8 ? -1.f : 1.f) * numerators[e & 7];
    if (!ok && plan_bad++ < 4) std::printf("MISMATCH plan_table apot4 x %g\n", factor);
  }
  {
    float values[16] = {0.f, .1f, .2f, .35f};  // .35 / .1 is not an integer
    af::TablePlan plan = af::plan_table(values, 256.f);
    if (plan.integral || plan.unscale != 0.25f || plan.scaled[3] != .35f * 4.f) plan_bad++, std::printf("MISMATCH plan_table non-integral\n");
    float wide[16] = {1.f, 300.f};  // an integer past bf16's 256
    plan = af::plan_table(wide, 256.f);
    if (plan.integral || plan.unscale != 256.f) plan_bad++, std::printf("MISMATCH plan_table past max_integer\n");
    if (!af::plan_table(wide, 2048.f).integral) plan_bad++, std::printf("MISMATCH plan_table fp16 integers\n");
    float zero[16] = {};
    plan = af::plan_table(zero, 256.f);
    if (plan.integral || plan.unscale != 1.f) plan_bad++, std::printf("MISMATCH plan_table zero table\n");
  }
  std::printf("%s: plan_table, %d wrong\n", plan_bad == 0 ? "OK" : "FAIL", plan_bad);
  return bad == 0 && plan_bad == 0 ? 0 : 1;
}
