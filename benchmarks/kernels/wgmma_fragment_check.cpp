// Host check of the A-fragment expansion of binary_weight_wgmma.cu (csrc/cuda/wgmma_fragment.cuh) against the
// PTX ISA fragment map of wgmma.mma_async.m64nNk16 with A in registers (figure wgmma-64N16-A):
//   lane l of warp w, g = l >> 2, t = l & 3, element e = 0..7 of its 4 registers (register e >> 1, low half first):
//   row = 16w + g + 8 ((e >> 1) & 1), col = 8 (e >> 2) + 2t + (e & 1)
// For random sign words of 64 rows x 32 k, every lane's registers of both k16 steps must hold +-1.0 (bf16 and
// fp16 bit patterns) equal to s(bit k of row `row`), k = 16 step + col. Build and run (no GPU, no CUDA):
//   g++ -std=c++17 -O2 -I csrc benchmarks/kernels/wgmma_fragment_check.cpp -o /tmp/frag && /tmp/frag
#include <cstdint>
#include <cstdio>
#include <random>

#include "cuda/wgmma_fragment.cuh"

namespace wf = bitcompile::wgmma_frag;

int main() {
  std::mt19937 random(7);
  int bad = 0, checked = 0;
  for (int trial = 0; trial < 200; ++trial) {
    uint32_t words[64];  // row r: k 0..31 of one packed word
    for (auto& w : words) w = trial == 0 ? 0xffffffffu : (trial == 1 ? 0u : random());
    for (int type = 0; type < 2; ++type) {
      const uint32_t minus_one = type == 0 ? wf::kMinusOneBf16 : wf::kMinusOneF16;
      const uint16_t plus = type == 0 ? 0x3F80 : 0x3C00, minus = type == 0 ? 0xBF80 : 0xBC00;
      for (int warp = 0; warp < 4; ++warp)
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane >> 2, t = lane & 3;
          const uint32_t wg = words[16 * warp + g], wg8 = words[16 * warp + g + 8];
          for (int step = 0; step < 2; ++step) {
            uint32_t a[4];
            const uint32_t lg = wf::split_lo(wg, t), hg = wf::split_hi(wg, t), lg8 = wf::split_lo(wg8, t),
                           hg8 = wf::split_hi(wg8, t);
            if (step == 0) wf::step_registers<0>(lg, hg, lg8, hg8, minus_one, a);
            else wf::step_registers<1>(lg, hg, lg8, hg8, minus_one, a);
            for (int e = 0; e < 8; ++e) {
              const int row = 16 * warp + g + 8 * ((e >> 1) & 1);
              const int k = 16 * step + 8 * (e >> 2) + 2 * t + (e & 1);
              const uint16_t got = static_cast<uint16_t>(a[e >> 1] >> (16 * (e & 1)));
              const uint16_t want = (words[row] >> k) & 1u ? plus : minus;
              ++checked;
              if (got != want && bad++ < 10)
                std::printf("MISMATCH type %d warp %d lane %d step %d e %d: got %04x want %04x\n", type, warp, lane,
                            step, e, got, want);
            }
          }
        }
    }
  }
  std::printf("%s: %d of %d fragment elements wrong\n", bad == 0 ? "OK" : "FAIL", bad, checked);
  return bad == 0 ? 0 : 1;
}
