// Host emulation of one block of binary_weight_wgmma_ws_kernel (csrc/cuda/binary_weight_wgmma.cu): where the producer
// puts x (two TMA boxes a 128-k stage, SWIZZLE_128B) and the W words (16 bytes a feature), what each consumer lane
// reads back (W rows, word kk / 2 of k16 step kk, the A fragment of wgmma_fragment.cuh), which bytes the B descriptor
// of step kk addresses, and where store_accumulators puts each accumulator; the block's tile is then compared with
// y = x s(W)^T computed directly. It checks the kernel's index arithmetic (transcribed here from the kernel) against
// the hardware's layout rules as the PTX ISA states them and the two earlier kernels rely on:
//   TMA SWIZZLE_128B: element (r, c) of a box of 128-byte rows lands at r * 128 + ((c * 2 / 16) ^ (r % 8)) * 16 +
//     (c * 2) % 16 (box 1024-byte aligned);
//   K-major SW128 matrix descriptor, start S, SBO 1024: element (n, k) of B is read at a = S + (n / 8) * 1024 +
//     (n % 8) * 128 + 2 k with address bits 4-6 XORed with bits 7-9;
//   A fragment (m64nNk16): lane l of warp w, element e of its 4 registers: row 16w + g + 8 ((e >> 1) & 1), col
//     8 (e >> 2) + 2t + (e & 1); D fragment, accumulator i: row 16w + g + 8 ((i >> 1) & 1), col 8 (i >> 2) + 2t +
//     (i & 1) (g = l >> 2, t = l & 3).
// Not checked: the timing (mbarriers, waits), the cluster reduction, the Epilogue. No GPU, no CUDA:
//   g++ -std=c++17 -O2 -I csrc benchmarks/kernels/wgmma_ws_layout_check.cpp -o /tmp/wslayout && /tmp/wslayout
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/wgmma_fragment.cuh"

namespace wf = bitcompile::wgmma_frag;

namespace {

float bf16_value(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
uint16_t bf16_bits(float f) {  // truncation is enough: the test values are small integers
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>(bits >> 16);
}

// One block (feature block 0, row block 0) of the kernel for tile (BN, SLABS); x [m][k] bf16, w [n][k / 32] words.
// Returns the number of wrong outputs.
int check_block(int BN, int SLABS, int m, int n, int k, std::mt19937& random) {
  const int kFeatures = 128 * SLABS, kXBoxBytes = BN * 128, kXBytes = 2 * kXBoxBytes;
  const int kStageBytes = (kXBytes + kFeatures * 16 + 1023) / 1024 * 1024;
  const int words = k / 32, total_tiles = (k + 127) / 128, half_tile = k % 128 != 0 ? total_tiles - 1 : -1;
  std::vector<uint16_t> x(static_cast<size_t>(m) * k);
  std::vector<uint32_t> w(static_cast<size_t>(n) * words);
  for (auto& v : x) v = bf16_bits(static_cast<float>(static_cast<int>(random() % 7) - 3));
  for (auto& v : w) v = random();

  std::vector<uint8_t> stage(kStageBytes);
  std::vector<float> acc(static_cast<size_t>(2 * 4 * 32) * SLABS * (BN / 2), 0.f);  // [wg][warp][lane][slab][i]
  auto acc_at = [&](int wg, int warp, int lane, int slab, int i) -> float& {
    return acc[((((wg * 4 + warp) * 32 + lane) * SLABS + slab) * (BN / 2)) + i];
  };
  for (int j = 0; j < total_tiles; ++j) {
    const bool half = j == half_tile;
    std::fill(stage.begin(), stage.end(), 0xAB);  // stale bytes: what a skipped copy leaves
    // ---- producer: x boxes (TMA, rows past M and k past K zero) and W words ----
    for (int box = 0; box < (half ? 1 : 2); ++box)
      for (int r = 0; r < BN; ++r)
        for (int c = 0; c < 64; ++c) {
          const int row = r, kk = j * 128 + 64 * box + c;
          const uint16_t v = row < m && kk < k ? x[static_cast<size_t>(row) * k + kk] : 0;
          const int offset = box * kXBoxBytes + r * 128 + (((c * 2) / 16) ^ (r % 8)) * 16 + (c * 2) % 16;
          std::memcpy(&stage[offset], &v, 2);
        }
    for (int f = 0; f < kFeatures; ++f) {
      uint32_t v[4] = {0, 0, 0, 0};
      if (f < n)
        for (int q = 0; q < (half ? 2 : 4); ++q) v[q] = w[static_cast<size_t>(f) * words + j * 4 + q];
      std::memcpy(&stage[kXBytes + f * 16], v, 16);
    }
    // ---- consumers ----
    for (int wg = 0; wg < 2; ++wg)
      for (int kk = 0; kk < (half ? 4 : 8); ++kk) {
        // A of the warpgroup, [slab][64 rows][16 k], from each lane's registers through the fragment map
        std::vector<float> a(static_cast<size_t>(SLABS) * 64 * 16, NAN);
        for (int warp = 0; warp < 4; ++warp)
          for (int lane = 0; lane < 32; ++lane) {
            const int g = lane >> 2, t = lane & 3;
            const int w_row = 64 * SLABS * wg + 16 * warp + g;
            for (int slab = 0; slab < SLABS; ++slab) {
              uint32_t row_g[4], row_h[4];
              std::memcpy(row_g, &stage[kXBytes + (w_row + 64 * slab) * 16], 16);
              std::memcpy(row_h, &stage[kXBytes + (w_row + 64 * slab + 8) * 16], 16);
              const uint32_t word_g = row_g[kk >> 1], word_h = row_h[kk >> 1];
              uint32_t r[4];
              const uint32_t lo_g = wf::split_lo(word_g, t), hi_g = wf::split_hi(word_g, t);
              const uint32_t lo_h = wf::split_lo(word_h, t), hi_h = wf::split_hi(word_h, t);
              if (kk & 1) wf::step_registers<1>(lo_g, hi_g, lo_h, hi_h, wf::kMinusOneBf16, r);
              else wf::step_registers<0>(lo_g, hi_g, lo_h, hi_h, wf::kMinusOneBf16, r);
              for (int e = 0; e < 8; ++e) {
                const int row = 16 * warp + g + 8 * ((e >> 1) & 1), col = 8 * (e >> 2) + 2 * t + (e & 1);
                a[(static_cast<size_t>(slab) * 64 + row) * 16 + col] =
                    bf16_value(static_cast<uint16_t>(r[e >> 1] >> (16 * (e & 1))));
              }
            }
          }
        // B of step kk through its descriptor
        const int start = (kk >> 2) * kXBoxBytes + 32 * (kk & 3);
        std::vector<float> b(static_cast<size_t>(BN) * 16);
        for (int nn = 0; nn < BN; ++nn)
          for (int c = 0; c < 16; ++c) {
            int address = start + (nn / 8) * 1024 + (nn % 8) * 128 + 2 * c;
            address ^= ((address >> 7) & 7) << 4;
            uint16_t v;
            std::memcpy(&v, &stage[address], 2);
            b[static_cast<size_t>(nn) * 16 + c] = bf16_value(v);
          }
        // D += A B, into the accumulators of the D fragment
        for (int warp = 0; warp < 4; ++warp)
          for (int lane = 0; lane < 32; ++lane) {
            const int g = lane >> 2, t = lane & 3;
            for (int slab = 0; slab < SLABS; ++slab)
              for (int i = 0; i < BN / 2; ++i) {
                const int row = 16 * warp + g + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * t + (i & 1);
                float sum = 0.f;
                for (int c = 0; c < 16; ++c)
                  sum += a[(static_cast<size_t>(slab) * 64 + row) * 16 + c] * b[static_cast<size_t>(col) * 16 + c];
                acc_at(wg, warp, lane, slab, i) += sum;
              }
          }
      }
  }
  // ---- store_accumulators: partial[row of x][feature] ----
  const int stride = kFeatures + 4;
  std::vector<float> partial(static_cast<size_t>(BN) * stride, NAN);
  for (int wg = 0; wg < 2; ++wg)
    for (int warp = 0; warp < 4; ++warp)
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane >> 2, t = lane & 3;
        for (int slab = 0; slab < SLABS; ++slab)
          for (int i = 0; i < BN / 2; ++i) {
            const int feature = 64 * (SLABS * wg + slab) + 16 * warp + g + 8 * ((i >> 1) & 1);
            const int row = 8 * (i >> 2) + 2 * t + (i & 1);
            partial[static_cast<size_t>(row) * stride + feature] = acc_at(wg, warp, lane, slab, i);
          }
      }
  int bad = 0;
  for (int row = 0; row < std::min(m, BN); ++row)
    for (int f = 0; f < std::min(n, kFeatures); ++f) {
      double want = 0;
      for (int kk = 0; kk < k; ++kk)
        want += bf16_value(x[static_cast<size_t>(row) * k + kk]) *
                ((w[static_cast<size_t>(f) * words + kk / 32] >> (kk % 32)) & 1u ? 1.0 : -1.0);
      const double got = partial[static_cast<size_t>(row) * stride + f];
      if (!(std::fabs(got - want) <= 1e-3) && bad++ < 5)
        std::printf("  BN %d SLABS %d m %d n %d k %d: row %d feature %d got %g want %g\n", BN, SLABS, m, n, k, row, f,
                    got, want);
    }
  return bad;
}

}  // namespace

int main() {
  std::mt19937 random(11);
  const int shapes[][3] = {{64, 256, 128}, {64, 256, 64}, {33, 200, 192}, {64, 256, 384}};  // m, n, k
  int bad = 0, blocks = 0;
  for (const auto& tile : {std::make_pair(64, 2), std::make_pair(128, 1), std::make_pair(128, 2),
                           std::make_pair(256, 1)})
    for (const auto& s : shapes) {
      const int m = std::min(s[0] * tile.first / 64, tile.first) - (s[0] == 33 ? 5 : 0);
      bad += check_block(tile.first, tile.second, m, std::min(s[1], 128 * tile.second), s[2], random);
      ++blocks;
    }
  std::printf("%s: %d wrong outputs in %d emulated blocks\n", bad == 0 ? "OK" : "FAIL", bad, blocks);
  return bad == 0 ? 0 : 1;
}
