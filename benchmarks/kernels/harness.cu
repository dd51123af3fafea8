// Torch-free kernel harness: checks and times the CUDA kernels of csrc/cuda through their launchers, one
// row per (family, shape, launch configuration). Built by build.sh with nvcc for sm_90a; carried to the
// GPU machine as a binary, so a sweep needs no pip install and no torch build (benchmarks/kernels/README.md).
//
//   harness FAMILY key=value ...        one row       (harness w1a16 m=1 n=8192 k=8192 slices=4)
//   harness --sweep FILE                a row per line of FILE ("FAMILY key=value ...", # comments)
//
// Families and keys (every family: reps=20 graph=1 rotate=1 plant=0 seed=1; rotate=0: the graph replays one copy):
//   w1a16  m n k dtype=bf16|fp16|fp32 kernel rows slices slabs   binary_weight_linear (WeightLinearTuning:
//          kernel=1 the tensor-core pass kernel, kernel=3 the (warp-specialized) wgmma kernel with
//          rows=32|64|128|192|256 slabs mc=0|1|2 (x by TMA multicast to a pair
//          of blocks; 0: where K is not split) head (rows of a first launch, -1 one launch; 0 and rows=0: the cost
//          model of wgmma_ws.cuh), 0 from M and the device; split=1|2|4 (the bit-plane kernel at M <= 4:
//          warps a 16-row tile; 0: by the shape); expect=reject: the
//          row passes only if the launcher answers cudaErrorNotSupported) alpha=1|scalar|vec bias=0|1 (the
//          Epilogue's scale: none, one for all features, one a feature; bias: one a feature) dump=0 (prints the
//          first dump bad outputs as row / column, got / want)
//   apot   m n k dtype bits=4 alpha=1|vec bias=0|1 offset=0  apot linear_small_batch (codes through a level
//          table; bits 1-4 nibbles, 5-8 bytes; alpha=vec per-output alpha; offset: W this many bytes off its
//          16-byte alignment, i.e. the byte-load kernel) kernel=0|1 (linear_small_batch: tiles=1..4 slices=1..8, 0
//          from the shape) | 3 (linear_wgmma, the sm_90a wgmma kernel, apot_wgmma.cu; rows=32|64|128|192|256
//          slices head, 0 from the shape);
//          table=random|scheme
//          (apot4's levels, multiples of 0.1: an integral table, exact in both kernels: linear_small_batch's
//          pair_product path, apot_frag::plan_table's integral plan); expect=reject: the launcher must answer
//          cudaErrorNotSupported)
//   w1a1   m n k out=fp32|fp16|bf16                      binary_linear on packed operands (the GEMM alone)
//          kernel=0 (by device and shape) | 1 (mma.sync) | 2 (the persistent wgmma kernel, sm_90) bn=128|256
//          (wgmma tile width), store=1 (st.global) | 2 (TMA store), stages=N (ring
//          depth); 0 or absent: from the shape
//          epi=0 (1: row factor, per-column scale, bias; 2: scalar scale, bias; 3: per-column scale) outoff=0 (the output pointer that
//          many elements past an aligned one; guard elements around the output must stay untouched)
//          pa=0 (1: x's row popcounts, computed on the host, given through launch_binary_linear's x_popcounts as the op
//          gives pack_signs' ones: the wgmma kernel then does not count them; 0: null, counted by the kernel)
//          expect=reject (the launcher must answer cudaErrorNotSupported)
//   conv   b c h w oc kh=3 kw=3 stride=1 pad=1 dil=1 out=fp16  binary_conv2d on packed NHWC input, channels_last out
//          padv=0 (the padded s(x): -1, 0, +1) nchw=0 (1: NCHW out) epi=0 (1: scale, bias, row factor; 2: scalar
//          scale, bias; 3: scale) outoff=0 (the output pointer that many elements past an aligned one) stray=0 (1: the weight's
//          bits past the last channel of every tap set; the result must ignore them) kernel=0 (ConvTuning: 1 the
//          mma.sync kernels, 2 the sm_90a wgmma kernel) tile=0
//          (the one-plane mma.sync kernel's tile: 1 128 x 64, 2 64 x 32, 3 the halo kernel; 0 by the shape) kg=0 (the 64 x 32 tile's K
//          groups: 1 or 2; 0 by the shape) pack=0 (1: the input is
//          fp16 NHWC activations with those signs, and each call is pack_signs + the conv, as the op launches them)
//          res=0 (1: Epilogue::residual, random values of the output's type and layout added after rounding)
//          resoff=0 (the residual pointer that many elements past an aligned one) sumw=0 (1: Epilogue::out_signs,
//          the output's sign words beside it, checked bit for bit against the signs of the values it stored;
//          plantw=1: one wanted bit flipped, the check must say NO)
//          expect=reject (the launcher must answer cudaErrorNotSupported)
//   read   n k blocks=0 threads=128 unroll=8 cluster=1 pdl=0   the read floor: n x k bits read and XORed, nothing
//          else (blocks=0: one per 64 rows, times cluster; clusters sync twice before leaving, as store_tile)
//   pack   m k dtype sign_zero=0 mean=0 pa=0 xoff=0       pack_signs (sign_zero: both torch.sign planes; mean: mean
//          |x| per row; pa: the popcount of each row's plus bits, binary_linear's x_popcounts; xoff: x that many
//          elements past an aligned pointer)
// Each row: correct or not (against a plain C++ reference: exact for the integer results, per element for
// float ones), microseconds per launch (cudaEvent, L2 flushed by writing a 128 MiB buffer before each timed
// launch, median of reps), microseconds per launch inside a CUDA graph of 100 launches that cycle over copies
// of the streamed operand totalling >= 192 MiB (so L2 cannot serve them), the achieved rate and the fraction
// of the floor (bytes at 4.4 TB/s, binary ops at 15.5 POPS: the H200's measured HBM read rate and b1 wgmma peak).
// plant=1 flips one weight bit in the reference's copy: the check must then report a mismatch ("NO", planted
// error caught); the exit status counts such a row as failed only if the mismatch went unseen.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/apot_fragment.cuh"
#include "cuda/apot_kernels.cuh"
#include "cuda/binary_kernels.cuh"
#include "cuda/device_common.cuh"

namespace {

using bitcompile::FloatType;
namespace bk = bitcompile::cuda;

constexpr double kBytesPerUs = 4.4e6;  // HBM read, 4.4 TB/s
constexpr double kOpsPerUs = 15.5e9;   // wgmma b1 AND.POPC, 15.5 POPS
constexpr int kGraphLaunches = 100;
constexpr size_t kRotateBytes = size_t{192} << 20;
constexpr size_t kFlushBytes = size_t{128} << 20;

#define CHECK_CUDA(call)                                                                         \
  do {                                                                                           \
    const cudaError_t error_ = (call);                                                           \
    if (error_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(error_)); \
      std::exit(2);                                                                              \
    }                                                                                            \
  } while (0)

struct Args {
  std::map<std::string, std::string> values;
  int64_t num(const char* key, int64_t fallback) const {
    auto it = values.find(key);
    return it == values.end() ? fallback : std::strtoll(it->second.c_str(), nullptr, 10);
  }
  std::string str(const char* key, const char* fallback) const {
    auto it = values.find(key);
    return it == values.end() ? fallback : it->second;
  }
};

// Deterministic random numbers (xorshift64*), so a row is reproducible from its seed.
struct Random {
  uint64_t state;
  explicit Random(uint64_t seed) : state(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 0x2545F4914F6CDD1Dull;
  }
  uint32_t word() { return static_cast<uint32_t>(next() >> 32); }
  float uniform() { return static_cast<float>((next() >> 40) * (1.0 / 16777216.0)) * 2.f - 1.f; }  // [-1, 1)
};

FloatType parse_type(const std::string& name) {
  if (name == "fp32") return FloatType::kFloat32;
  if (name == "fp16") return FloatType::kFloat16;
  if (name == "bf16") return FloatType::kBFloat16;
  std::fprintf(stderr, "unknown dtype %s (fp32, fp16, bf16)\n", name.c_str());
  std::exit(2);
}
size_t type_size(FloatType t) { return t == FloatType::kFloat32 ? 4 : 2; }

// Host values in a device float type: rounded once from float, stored as raw bytes.
std::vector<uint8_t> encode(const std::vector<float>& values, FloatType t, std::vector<float>* rounded) {
  std::vector<uint8_t> bytes(values.size() * type_size(t));
  if (rounded) rounded->resize(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    float r = values[i];
    if (t == FloatType::kFloat16) {
      const __half h = __float2half_rn(values[i]);
      std::memcpy(&bytes[2 * i], &h, 2);
      r = __half2float(h);
    } else if (t == FloatType::kBFloat16) {
      const __nv_bfloat16 h = __float2bfloat16_rn(values[i]);
      std::memcpy(&bytes[2 * i], &h, 2);
      r = __bfloat162float(h);
    } else {
      std::memcpy(&bytes[4 * i], &r, 4);
    }
    if (rounded) (*rounded)[i] = r;
  }
  return bytes;
}
std::vector<double> decode(const std::vector<uint8_t>& bytes, FloatType t) {
  const size_t n = bytes.size() / type_size(t);
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (t == FloatType::kFloat16) {
      __half h;
      std::memcpy(&h, &bytes[2 * i], 2);
      out[i] = __half2float(h);
    } else if (t == FloatType::kBFloat16) {
      __nv_bfloat16 h;
      std::memcpy(&h, &bytes[2 * i], 2);
      out[i] = __bfloat162float(h);
    } else {
      float f;
      std::memcpy(&f, &bytes[4 * i], 4);
      out[i] = f;
    }
  }
  return out;
}
// Relative rounding of one output value of type t (half an ulp).
double rounding(FloatType t) { return t == FloatType::kFloat32 ? 6e-8 : (t == FloatType::kFloat16 ? 4.9e-4 : 3.9e-3); }

// Device buffer that frees itself.
struct Buffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit Buffer(size_t n) : bytes(n) { CHECK_CUDA(cudaMalloc(&ptr, n > 0 ? n : 16)); }
  ~Buffer() { cudaFree(ptr); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

// `copies` device copies of host bytes (copy 0 is what the check reads).
struct Copies {
  std::vector<std::unique_ptr<Buffer>> buffers;
  Copies(const void* host, size_t bytes, int copies) {
    for (int i = 0; i < copies; ++i) {
      buffers.emplace_back(new Buffer(bytes));
      CHECK_CUDA(cudaMemcpy(buffers.back()->ptr, host, bytes, cudaMemcpyHostToDevice));
    }
  }
  void* operator[](int i) const { return buffers[i % buffers.size()]->ptr; }
};
// epi= of the w1a1 and conv rows: y = dot * factor[row] * scale[column or 0] + bias[column]; epi=1: a scale a
// column and a row factor, epi=2: one scale, no factor, epi=3: a scale a column only (binary_linear(x, w, k, alpha), the
// BNN layer's form), epi=4: a signed scale a column (every fifth 0) and a bias, 0: none. The host values (for the
// reference), their device copies and the kernels' Epilogue.
struct HarnessEpilogue {
  std::vector<float> scale, bias, factor;
  std::unique_ptr<Buffer> scale_d, bias_d, factor_d;
  bk::Epilogue ep;
  HarnessEpilogue(int epi, int64_t columns, int64_t rows, Random& random);
};

// Copies of the streamed operand the graph cycles over: enough for >= 192 MiB, or one (graph=0, or rotate=0: the
// graph replays one copy, which L2 may then serve: what a prefetch into L2 would buy).
int rotating_copies(const Args& args, size_t bytes) {
  if (args.num("graph", 1) == 0 || args.num("rotate", 1) == 0) return 1;
  return static_cast<int>(std::min<size_t>(2048, std::max<size_t>(1, (kRotateBytes + bytes - 1) / std::max<size_t>(bytes, 1))));
}

struct Timing {
  double us = 0, graph_us = 0;
};

// launch(copy) enqueues one launch on `stream` reading copy `copy` of the streamed operand.
Timing time_launches(const std::function<cudaError_t(int, cudaStream_t)>& launch, int copies, const Args& args) {
  static Buffer flush(kFlushBytes);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  Timing timing;
  const int reps = static_cast<int>(std::max<int64_t>(1, args.num("reps", 20)));
  CHECK_CUDA(launch(0, stream));  // warm-up (also sets shared memory limits, cluster queries)
  std::vector<float> samples;
  for (int r = 0; r < reps; ++r) {
    CHECK_CUDA(cudaMemsetAsync(flush.ptr, r & 0xff, kFlushBytes, stream));
    CHECK_CUDA(cudaEventRecord(start, stream));
    CHECK_CUDA(launch(r % copies, stream));
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    samples.push_back(ms * 1000.f);
  }
  std::sort(samples.begin(), samples.end());
  timing.us = samples[samples.size() / 2];
  if (args.num("graph", 1) != 0) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < kGraphLaunches; ++i) CHECK_CUDA(launch(i % copies, stream));
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    CHECK_CUDA(cudaGraphLaunch(exec, stream));  // warm-up
    std::vector<float> replays;
    for (int r = 0; r < 5; ++r) {
      CHECK_CUDA(cudaEventRecord(start, stream));
      CHECK_CUDA(cudaGraphLaunch(exec, stream));
      CHECK_CUDA(cudaEventRecord(stop, stream));
      CHECK_CUDA(cudaEventSynchronize(stop));
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
      replays.push_back(ms * 1000.f / kGraphLaunches);
    }
    std::sort(replays.begin(), replays.end());
    timing.graph_us = replays[replays.size() / 2];
    CHECK_CUDA(cudaGraphExecDestroy(exec));
    CHECK_CUDA(cudaGraphDestroy(graph));
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  CHECK_CUDA(cudaStreamDestroy(stream));
  return timing;
}

struct Row {
  std::string family, shape, config, check;
  bool ok = false;
  bool planted = false;  // plant=1: the check must fail (ok == false is the expected outcome)
  Timing timing;
  double rate = 0;  // TB/s or POPS at the do_bench-style time
  const char* rate_unit = "TB/s";
  double floor_us = 0;
};

void print_header() {
  std::printf("%-6s %-34s %-18s %-4s %10s %10s %9s %7s  %s\n", "family", "shape", "config", "ok", "us", "graph_us",
              "rate", "floor%", "check");
}
void print_row(const Row& r) {
  const double best = r.timing.graph_us > 0 ? r.timing.graph_us : r.timing.us;
  std::printf("%-6s %-34s %-18s %-4s %10.2f %10.2f %6.2f %-4s %6.1f%%  %s\n", r.family.c_str(), r.shape.c_str(),
              r.config.c_str(), r.ok ? "yes" : "NO", r.timing.us, r.timing.graph_us, r.rate, r.rate_unit,
              100.0 * r.floor_us / best, r.check.c_str());
  std::fflush(stdout);
}

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char buffer[512];
  va_list list;
  va_start(list, fmt);
  std::vsnprintf(buffer, sizeof buffer, fmt, list);
  va_end(list);
  return buffer;
}

// The indices the reference computes: all of them up to 4 x edge, else the first and last `edge` (tile edges),
// every 61st and, with tile_rows, both rows at every 64-row boundary (the host reference of a large GEMM would take
// minutes).
std::vector<int64_t> sample(int64_t count, int64_t edge = 128, bool tile_rows = false) {
  std::vector<int64_t> picked;
  for (int64_t i = 0; i < count; ++i)
    if (count <= 4 * edge || i < edge || i >= count - edge || i % 61 == 0 || (tile_rows && (i % 64 == 0 || i % 64 == 63)))
      picked.push_back(i);
  return picked;
}

// Per-element check of float results at the computed indices: |y - ref| <= 2 rounding(out) |ref| + 1e-5 magnitude,
// NaN (the poison of an unwritten output) never passes.
// dump > 0: also prints the first `dump` bad entries as (row, column) of a `cols`-column output, for telling a layout
// error (bad entries in a pattern of rows / columns) from a race (scattered, changing from run to run).
bool check_values(const std::vector<double>& got, const std::vector<double>& want, const std::vector<double>& magnitude,
                  const std::vector<int64_t>& checked, FloatType out, std::string& message, int64_t cols = 1,
                  int64_t dump = 0) {
  double worst = 0;
  size_t worst_index = 0, bad = 0;
  for (const int64_t i : checked) {
    const double allowed = 2 * rounding(out) * std::fabs(want[i]) + 1e-5 * magnitude[i] + 1e-30;
    const double error = std::isfinite(got[i]) ? std::fabs(got[i] - want[i]) / allowed : INFINITY;
    if (error > 1 && static_cast<int64_t>(bad) < dump)
      std::printf("  bad row %lld col %lld: got %.6g want %.6g\n", static_cast<long long>(i / cols),
                  static_cast<long long>(i % cols), got[i], want[i]);
    if (error > 1) ++bad;
    if (!(error <= worst)) {
      worst = error;
      worst_index = i;
    }
  }
  message = format("%zu of %zu checked bad; worst %.3g of allowed at %zu (got %.6g want %.6g)", bad, checked.size(),
                   worst, worst_index, got[worst_index], want[worst_index]);
  return bad == 0;
}

uint32_t tail_mask(int64_t k, int64_t word) {
  const int64_t left = k - word * 32;
  return left >= 32 ? 0xffffffffu : (1u << left) - 1u;
}
std::vector<uint32_t> random_bits(Random& random, int64_t rows, int64_t k) {
  const int64_t words = (k + 31) / 32;
  std::vector<uint32_t> bits(rows * words);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t w = 0; w < words; ++w) bits[r * words + w] = random.word() & tail_mask(k, w);
  return bits;
}
inline int sign_of(const std::vector<uint32_t>& bits, int64_t words, int64_t row, int64_t k) {
  return (bits[row * words + k / 32] >> (k % 32)) & 1u ? 1 : -1;
}

// A row's first launch. expect=reject rows pass only if the launcher answers cudaErrorNotSupported (refused, not run);
// a refusal that was not expected fails the row, not the sweep. True when the row ends there (ok and check set).
bool refused(Row& row, const Args& args, cudaError_t first) {
  const bool expect_reject = args.str("expect", "") == "reject";
  if (!expect_reject && first != cudaErrorNotSupported && first != cudaErrorInvalidValue) return false;
  (void)cudaGetLastError();
  row.ok = expect_reject && first == cudaErrorNotSupported;
  row.check = format("launcher answered %s%s", cudaGetErrorName(first),
                     expect_reject ? (row.ok ? " (rejection expected)" : " (a rejection was expected)") : "");
  CHECK_CUDA(cudaDeviceSynchronize());
  return true;
}

// ---- w1a16 and apot: y[m, n] = sum_k x[m, k] * weight(n, k) -----------------------------------------------
HarnessEpilogue::HarnessEpilogue(int epi, int64_t columns, int64_t rows, Random& random) {
  if (epi != 0) {
    scale.resize(epi == 2 ? 1 : columns);
    bias.assign(columns, 0.f);
    for (auto& v : scale) v = 0.5f + 0.5f * (random.uniform() + 1.f);
    if (epi == 4) {  // signed, every fifth zero
      for (size_t i = 0; i < scale.size(); ++i) scale[i] = i % 5 == 0 ? 0.f : 1.5f * random.uniform();
    }
    if (epi != 3) {
      for (auto& v : bias) v = 50.f * random.uniform();
    }
    if (epi == 1) {
      factor.resize(rows);
      for (auto& v : factor) v = 0.5f + 0.5f * (random.uniform() + 1.f);
    }
  }
  auto upload = [](const std::vector<float>& values) {
    auto buffer = std::make_unique<Buffer>(values.size() * 4);
    if (!values.empty()) CHECK_CUDA(cudaMemcpy(buffer->ptr, values.data(), values.size() * 4, cudaMemcpyHostToDevice));
    return buffer;
  };
  scale_d = upload(scale);
  bias_d = upload(bias);
  factor_d = upload(factor);
  if (epi != 0) {
    ep.scale = scale_d->as<float>();
    ep.scale_count = static_cast<int64_t>(scale.size());
    ep.bias = epi == 3 ? nullptr : bias_d->as<float>();
    ep.row_factor = factor.empty() ? nullptr : factor_d->as<float>();
  }
}

Row run_w1a16(const Args& args, bool apot) {
  const int64_t m = args.num("m", 1), n = args.num("n", 8192), k = args.num("k", 8192);
  const FloatType type = parse_type(args.str("dtype", "bf16"));
  const int bits = static_cast<int>(args.num("bits", 4));
  Random random(static_cast<uint64_t>(args.num("seed", 1)));
  Row row;
  row.family = apot ? "apot" : "w1a16";
  row.shape = format("m=%lld n=%lld k=%lld %s", (long long)m, (long long)n, (long long)k, args.str("dtype", "bf16").c_str());

  std::vector<float> x_values(m * k), x_rounded;
  for (auto& v : x_values) v = random.uniform();
  const std::vector<uint8_t> x_bytes = encode(x_values, type, &x_rounded);
  // The weight: bits (w1a16) or codes (apot: nibbles for bits <= 4, else bytes) and the value of each entry
  // for the reference (apot: the level times alpha).
  const int64_t words = (k + 31) / 32;
  std::vector<uint32_t> w_bits;
  std::vector<uint8_t> codes;
  if (apot && (bits < 1 || bits > 8)) {
    std::fprintf(stderr, "apot: bits=%d, want 1..8\n", bits);
    std::exit(2);
  }
  const bool nibbles = bits <= 4;
  const unsigned levels = 1u << bits;
  std::vector<float> table(apot ? levels : 0), alpha_values(n, 1.f), bias_values(n, 0.f);
  const int64_t row_bytes = nibbles ? (k + 1) / 2 : k;
  const bool alpha_vector = args.str("alpha", "1") == "vec", with_bias = args.num("bias", 0) != 0;
  const bool alpha_scalar = !apot && args.str("alpha", "1") == "scalar";  // w1a16: one scale for every feature
  if (apot) {
    for (auto& v : table) v = random.uniform();
    codes.assign(n * row_bytes, 0);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < k; ++j) {
        const uint32_t code = random.word() % levels;
        if (nibbles) codes[r * row_bytes + j / 2] |= static_cast<uint8_t>(code << (4 * (j % 2)));
        else codes[r * row_bytes + j] = static_cast<uint8_t>(code);
      }
    if (alpha_vector)
      for (auto& v : alpha_values) v = 1.f + 0.5f * random.uniform();
    if (with_bias)
      for (auto& v : bias_values) v = random.uniform();
  } else {  // w1a16: the Epilogue's scale (alpha=vec: per feature, alpha=scalar: one) and bias (bias=1)
    w_bits = random_bits(random, n, k);
    if (alpha_vector)
      for (auto& v : alpha_values) v = 1.f + 0.5f * random.uniform();
    if (alpha_scalar) std::fill(alpha_values.begin(), alpha_values.end(), 0.75f);
    if (with_bias)
      for (auto& v : bias_values) v = random.uniform();
  }
  // table=scheme: apot4's signed levels (SPEC 2.5: multiples of 0.1: linear_small_batch's pair_product path,
  // apot_frag::plan_table's integral plan).
  if (apot && args.str("table", "random") == "scheme") {
    const float magnitudes[8] = {0.f, .1f, .2f, .3f, .4f, .6f, .8f, 1.f};
    for (unsigned e = 0; e < levels; ++e) table[e] = (e & 8u ? -1.f : 1.f) * magnitudes[e & 7u];
  }
  // The reference's entries: kernel=2 (linear_wgmma, bf16 / fp16 x) takes the table as apot_frag::plan_table plans
  // it (integer multiples of one base exact, any other table rounded to x's type after a power-of-two scaling), and
  // the reference takes the same values; the other kernels read the fp32 table.
  std::vector<double> ref_table(table.begin(), table.end());
  if (apot && nibbles && args.num("kernel", 0) >= 2 && type != FloatType::kFloat32) {
    float values[16] = {};
    for (unsigned e = 0; e < levels; ++e) values[e] = table[e];
    const bitcompile::apot_frag::TablePlan plan =
        bitcompile::apot_frag::plan_table(values, type == FloatType::kFloat16 ? 2048.f : 256.f);
    std::vector<float> entries(plan.scaled, plan.scaled + 16), rounded = entries;
    if (!plan.integral) encode(entries, type, &rounded);
    for (unsigned e = 0; e < levels; ++e) ref_table[e] = static_cast<double>(rounded[e]) * plan.unscale;
  }
  auto code_of = [&](const std::vector<uint8_t>& codesv, int64_t r, int64_t j) -> unsigned {
    return nibbles ? (codesv[r * row_bytes + j / 2] >> (4 * (j % 2))) & 15u : codesv[r * row_bytes + j];
  };
  auto weight = [&](const auto& bitsv, const auto& codesv, int64_t r, int64_t j) -> double {
    if (apot) return ref_table[code_of(codesv, r, j)] * alpha_values[r];
    return sign_of(bitsv, words, r, j);
  };
  // plant=1: the reference sees one flipped weight, at the largest |x| of row 0 (a change far above rounding).
  std::vector<uint32_t> ref_bits = w_bits;
  std::vector<uint8_t> ref_codes = codes;
  if (args.num("plant", 0) != 0) {
    int64_t j = 0;
    for (int64_t i = 1; i < k; ++i)
      if (std::fabs(x_rounded[i]) > std::fabs(x_rounded[j])) j = i;
    if (apot) {  // the code whose level is furthest from the stored one
      const unsigned code = code_of(ref_codes, 0, j);
      unsigned furthest = code;
      for (unsigned c = 0; c < levels; ++c)
        if (std::fabs(table[c] - table[code]) > std::fabs(table[furthest] - table[code])) furthest = c;
      if (nibbles) {
        const unsigned shift = 4 * (j % 2);
        ref_codes[j / 2] = static_cast<uint8_t>((ref_codes[j / 2] & ~(15u << shift)) | (furthest << shift));
      } else {
        ref_codes[j] = static_cast<uint8_t>(furthest);
      }
    }
    else
      ref_bits[j / 32] ^= 1u << (j % 32);
  }
  std::vector<double> want(m * n), magnitude(m * n);
  std::vector<int64_t> checked;
  // The reference costs rows x columns x k multiply-adds (16384^2 at M = 385 took ~20 s with 128-index edges):
  // past 2^29 of them, 32-index edges, and the rows at every 64-row tile boundary.
  const bool large = k * std::min<int64_t>(m, 512) * std::min<int64_t>(n, 512) > (int64_t(1) << 29);
  // The fp32 sum's rounding grows as sqrt(k): the 1e-5 of check_values was set at k <= 4096. apot M = 4096, k = 8192
  // failed 1 output of 50038 at 1.04 of it on main's own default kernel (H100, forty-first session: 0.00112915
  // against 0.000759115, an l2 norm of ~36), a near-zero output's summation order, not a layout error.
  const double sum_growth = std::sqrt(std::max(1.0, static_cast<double>(k) / 4096.0));
  for (const int64_t i : sample(m, large ? 32 : 128, large)) {
    for (const int64_t r : sample(n, large ? 32 : 128)) {
      checked.push_back(i * n + r);
      double sum = 0, squares = 0;
      for (int64_t j = 0; j < k; ++j) {
        const double term = x_rounded[i * k + j] * weight(ref_bits, ref_codes, r, j);
        sum += term;
        squares += term * term;
      }
      const double scale = apot ? 1.0 : alpha_values[r];  // apot: alpha is in weight()
      want[i * n + r] = sum * scale + bias_values[r];
      magnitude[i * n + r] = std::sqrt(squares) * sum_growth * std::fabs(scale) + std::fabs(bias_values[r]);
    }
  }

  const size_t weight_bytes = apot ? codes.size() : w_bits.size() * 4;
  const int copies = rotating_copies(args, weight_bytes);
  // apot offset=B: W starts B bytes into its buffer (B % 16 != 0: no 16-byte loads).
  const size_t offset = apot ? static_cast<size_t>(std::max<int64_t>(0, args.num("offset", 0))) : 0;
  std::vector<uint8_t> shifted;
  if (offset != 0) {
    shifted.assign(offset, 0);
    shifted.insert(shifted.end(), codes.begin(), codes.end());
  }
  Copies weights(apot ? static_cast<const void*>(offset != 0 ? shifted.data() : codes.data())
                      : static_cast<const void*>(w_bits.data()),
                 weight_bytes + offset, copies);
  Buffer x(x_bytes.size()), y(m * n * type_size(type)), table_device(std::max<size_t>(1, table.size()) * sizeof(float)),
      alpha(n * sizeof(float)), bias(n * sizeof(float));
  const int64_t alpha_count = alpha_vector ? n : 1;
  CHECK_CUDA(cudaMemcpy(alpha.ptr, alpha_values.data(), alpha_count * sizeof(float), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(bias.ptr, bias_values.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  Buffer workspace(std::max<int64_t>(1, bitcompile::apot::linear_small_batch_workspace(m, k, n)) * sizeof(float));
  CHECK_CUDA(cudaMemcpy(x.ptr, x_bytes.data(), x_bytes.size(), cudaMemcpyHostToDevice));
  if (apot) CHECK_CUDA(cudaMemcpy(table_device.ptr, table.data(), table.size() * sizeof(float), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(y.ptr, 0xff, y.bytes));  // NaN poison: an unwritten output fails the check

  bk::WeightLinearTuning tuning;
  tuning.rows_per_pass = static_cast<int>(args.num("rows", 0));
  tuning.slices = static_cast<int>(args.num("slices", 0));
  tuning.remainder = static_cast<int>(args.num("remainder", 0));  // -1: never split off the last rows
  tuning.kernel = static_cast<int>(args.num("kernel", 0));
  tuning.slabs = static_cast<int>(args.num("slabs", 0));
  tuning.multicast = static_cast<int>(args.num("mc", 0));
  tuning.split = static_cast<int>(args.num("split", 0));
  tuning.head = static_cast<int>(args.num("head", 0));
  Buffer planes(bk::binary_weight_linear_workspace_bytes(type, m, k));  // cudaMalloc: 256-byte aligned
  row.config = apot ? format("bits=%d%s%s%s", bits, alpha_vector ? " a=vec" : "", with_bias ? " bias" : "",
                             offset != 0 ? format(" off=%zu", offset).c_str() : "")
               : tuning.kernel >= 2 ? format("kern=%d rows=%d sb=%d sl=%d%s%s%s", tuning.kernel, tuning.rows_per_pass,
                                             tuning.slabs, tuning.slices,
                                             tuning.multicast != 0 ? format(" mc=%d", tuning.multicast).c_str() : "",
                                             alpha_vector ? " a=vec" : (alpha_scalar ? " a=sc" : ""),
                                             with_bias ? " bias" : "")
                                    : format("kern=%d rows=%d sl=%d%s%s", tuning.kernel, tuning.rows_per_pass,
                                             tuning.slices, alpha_vector ? " a=vec" : (alpha_scalar ? " a=sc" : ""),
                                             with_bias ? " bias" : "");
  if (!apot && tuning.remainder != 0) row.config += format(" rem=%d", tuning.remainder);
  if (!apot && tuning.split != 0) row.config += format(" split=%d", tuning.split);
  if (tuning.head != 0) row.config += format(" head=%d", tuning.head);
  bk::Epilogue epilogue;  // w1a16
  if (alpha_vector || alpha_scalar) {
    epilogue.scale = alpha.as<float>();
    epilogue.scale_count = alpha_count;
  }
  if (with_bias) epilogue.bias = bias.as<float>();
  // apot kernel=3: linear_wgmma (apot_wgmma.cu) with rows=32|64|128|192|256 slices head (0: from the shape; kernel=2,
  // the deleted all-threads kernel, reaches it too and is refused there); 0 / 1: linear_small_batch.
  bitcompile::apot::WgmmaTuning apot_tuning;
  apot_tuning.rows = tuning.rows_per_pass;
  apot_tuning.slices = tuning.slices;
  apot_tuning.kernel = tuning.kernel;
  apot_tuning.head = tuning.head;
  if (apot && tuning.kernel >= 2)
    row.config = format("kern=%d rows=%d sl=%d %s", tuning.kernel, apot_tuning.rows, apot_tuning.slices,
                        row.config.c_str());
  // apot kernel 0 / 1 (linear_small_batch): tiles=1..4 16-row tiles a block, slices=1..8 splits of K (0: the plan).
  bitcompile::apot::SmallBatchTuning small_tuning;
  small_tuning.tiles = static_cast<int>(args.num("tiles", 0));
  small_tuning.splits = tuning.slices;
  int taken[2] = {0, 0};  // the plan launched, printed after the check
  small_tuning.taken = taken;
  if (apot && tuning.kernel < 2) row.config = format("tiles=%d sl=%d %s", small_tuning.tiles, small_tuning.splits, row.config.c_str());
  auto launch = [&](int copy, cudaStream_t stream) -> cudaError_t {
    if (apot && tuning.kernel >= 2) {
      return bitcompile::apot::linear_wgmma(x.ptr, type, m, k, static_cast<const uint8_t*>(weights[copy]) + offset, n, bits,
                                            table_device.as<float>(), alpha.as<float>(), alpha_count,
                                            with_bias ? bias.as<float>() : nullptr, y.ptr, stream, &apot_tuning);
    }
    if (apot) {
      return bitcompile::apot::linear_small_batch(x.ptr, type, m, k, static_cast<const uint8_t*>(weights[copy]) + offset,
                                                  n, bits, table_device.as<float>(), alpha.as<float>(), alpha_count,
                                                  with_bias ? bias.as<float>() : nullptr, y.ptr, workspace.as<float>(),
                                                  stream, &small_tuning);
    }
    return bk::launch_binary_weight_linear(x.ptr, type, static_cast<const uint32_t*>(weights[copy]), m, n, k,
                                           epilogue, y.ptr, planes.ptr, planes.bytes, stream, &tuning);
  };
  // expect=reject: kernel=2/3 where wgmma does not apply (k % 64 != 0, fp32 x, not an sm_90a build on a 9.0 device)
  const cudaError_t first = launch(0, nullptr);
  if (refused(row, args, first)) return row;
  CHECK_CUDA(first);
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<uint8_t> y_bytes(y.bytes);
  CHECK_CUDA(cudaMemcpy(y_bytes.data(), y.ptr, y.bytes, cudaMemcpyDeviceToHost));
  row.ok = check_values(decode(y_bytes, type), want, magnitude, checked, type, row.check, n, args.num("dump", 0));
  if (apot && tuning.kernel < 2) row.config += format(" plan=%d,%d", taken[0], taken[1]);

  row.timing = time_launches(launch, copies, args);
  const double bytes = weight_bytes + x_bytes.size() + y.bytes;
  row.floor_us = bytes / kBytesPerUs;
  row.rate = bytes / row.timing.us / 1e6;
  return row;
}

// ---- w1a1: dot[m, n] = s(x[m]) . s(w[n]) on packed operands ----------------------------------------------
// epi=1: y = dot * row_factor[m] * scale[n] + bias[n]; epi=2: a scalar scale and bias; epi=3: scale[n] only.
// outoff: the output that many elements past a 256-byte aligned pointer (not 16-byte aligned: no TMA stores).
// Poisoned guard elements around the output must stay untouched (a store outside the output fails the row).
Row run_w1a1(const Args& args) {
  const int64_t m = args.num("m", 4096), n = args.num("n", 8192), k = args.num("k", 8192);
  const FloatType out = parse_type(args.str("out", "fp32"));
  const int epi = static_cast<int>(args.num("epi", 0));
  const int64_t out_offset = args.num("outoff", 0);
  Random random(static_cast<uint64_t>(args.num("seed", 1)));
  const int64_t words = (k + 31) / 32;
  Row row;
  row.family = "w1a1";
  row.shape = format("m=%lld n=%lld k=%lld out=%s", (long long)m, (long long)n, (long long)k, args.str("out", "fp32").c_str());
  bk::BinaryLinearTuning tuning;
  tuning.kernel = static_cast<int>(args.num("kernel", 0));
  tuning.tile_n = static_cast<int>(args.num("bn", 0));
  tuning.store = static_cast<int>(args.num("store", 0));
  tuning.stages = static_cast<int>(args.num("stages", 0));
  row.config = format("kern=%d bn=%d", tuning.kernel, tuning.tile_n);
  if (tuning.kernel != 1) row.config += format(" s%d st%d", tuning.store, tuning.stages);
  if (epi != 0) row.config += format(" epi=%d", epi);
  if (out_offset != 0) row.config += format(" off=%lld", (long long)out_offset);
  row.rate_unit = "POPS";
  const std::vector<uint32_t> x_bits = random_bits(random, m, k), w_bits = random_bits(random, n, k);
  // pa=1: the rows' popcounts given to the kernel (launch_binary_linear's x_popcounts) instead of counted by it
  const bool given_pa = args.num("pa", 0) != 0;
  std::vector<int32_t> x_popcounts(given_pa ? m : 0, 0);
  for (int64_t i = 0; i < static_cast<int64_t>(x_popcounts.size()); ++i) {
    for (int64_t w = 0; w < words; ++w) x_popcounts[i] += __builtin_popcount(x_bits[i * words + w] & tail_mask(k, w));
  }
  Buffer x_popcounts_d(x_popcounts.size() * 4);
  if (given_pa) {
    CHECK_CUDA(cudaMemcpy(x_popcounts_d.ptr, x_popcounts.data(), x_popcounts_d.bytes, cudaMemcpyHostToDevice));
    row.config += " pa";
  }
  std::vector<uint32_t> ref_w = w_bits;
  if (args.num("plant", 0) != 0) ref_w[0] ^= 1u;
  const HarnessEpilogue epilogue(epi, n, m, random);
  const std::vector<float>&scale = epilogue.scale, &bias = epilogue.bias, &factor = epilogue.factor;
  std::vector<double> want(m * n), magnitude(m * n, 0.0);
  std::vector<int64_t> checked;
  for (const int64_t i : sample(m)) {
    for (const int64_t r : sample(n)) {
      checked.push_back(i * n + r);
      int64_t differ = 0;
      for (int64_t w = 0; w < words; ++w) differ += __builtin_popcount((x_bits[i * words + w] ^ ref_w[r * words + w]) & tail_mask(k, w));
      double y = static_cast<double>(k - 2 * differ);
      if (epi != 0) {
        const double product = y * (factor.empty() ? 1.0 : factor[i]) * scale[scale.size() == 1 ? 0 : r];
        y = product + bias[r];
        magnitude[i * n + r] = std::fabs(product) + std::fabs(bias[r]);  // fp32 rounding of the epilogue
      }
      want[i * n + r] = y;
    }
  }
  const size_t weight_bytes = w_bits.size() * 4;
  const int copies = rotating_copies(args, weight_bytes);
  Copies weights(w_bits.data(), weight_bytes, copies);
  constexpr int64_t kGuard = 128;  // poisoned elements before and after the output (256-byte aligned start)
  const size_t size = type_size(out), out_bytes = static_cast<size_t>(m * n) * size;
  Buffer x(x_bits.size() * 4), y(out_bytes + (out_offset + 2 * kGuard) * size);
  CHECK_CUDA(cudaMemcpy(x.ptr, x_bits.data(), x.bytes, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(y.ptr, 0xff, y.bytes));  // NaN poison: an unwritten output fails the check
  uint8_t* const out_ptr = y.as<uint8_t>() + (kGuard + out_offset) * size;
  const bk::Epilogue& ep = epilogue.ep;
  auto launch = [&](int copy, cudaStream_t stream) {
    return bk::launch_binary_linear(x.as<uint32_t>(), static_cast<const uint32_t*>(weights[copy]), m, n, k, ep, out_ptr,
                                    out, given_pa ? x_popcounts_d.as<int32_t>() : nullptr, stream, &tuning);
  };
  // expect=reject: kernel=2 on a shape wgmma does not take
  const cudaError_t first = launch(0, nullptr);
  if (refused(row, args, first)) return row;
  CHECK_CUDA(first);
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<uint8_t> all_bytes(y.bytes);
  CHECK_CUDA(cudaMemcpy(all_bytes.data(), y.ptr, y.bytes, cudaMemcpyDeviceToHost));
  const size_t head = (kGuard + out_offset) * size;
  const std::vector<uint8_t> y_bytes(all_bytes.begin() + head, all_bytes.begin() + head + out_bytes);
  row.ok = check_values(decode(y_bytes, out), want, magnitude, checked, out, row.check);  // fp32: exact (< 2^24)
  size_t guard_hits = 0;
  for (size_t i = 0; i < all_bytes.size(); ++i) guard_hits += (i < head || i >= head + out_bytes) && all_bytes[i] != 0xff;
  if (guard_hits != 0) {
    row.ok = false;
    row.check += format("; %zu bytes written outside the output", guard_hits);
  }
  row.timing = time_launches(launch, copies, args);
  const double ops = 2.0 * m * n * k;
  const double bytes = weight_bytes + x.bytes + x_popcounts.size() * 4.0 + out_bytes;
  row.floor_us = std::max(ops / kOpsPerUs, bytes / kBytesPerUs);
  row.rate = ops / row.timing.us / 1e9;
  return row;
}

// ---- conv: binary_conv2d on packed NHWC input ----------------------------------------------------------------
// conv ... signs=1: launch_binary_conv2d_signs, checked bit for bit against the signs of the reference values (a
// value within fp32 rounding of 0 may go either way: not checked), with guard words around the output.
Row conv_sign_words(const Args& args, Row& row, const bk::ConvShape& s, Copies& inputs, int copies,
                    const std::vector<uint32_t>& w_bits, const bk::Epilogue& ep, const std::vector<double>& want,
                    const std::vector<double>& magnitude, bool nchw, const bk::ConvTuning& tuning) {
  if (nchw) {
    row.check = "signs=1 writes pixel-major words: nchw does not apply";
    return row;
  }
  const int64_t pixels = s.batch * s.out_height * s.out_width, words = (s.out_channels + 31) / 32;
  std::vector<uint32_t> want_words(pixels * words, 0), checked_bits(pixels * words, 0);
  for (int64_t p = 0; p < pixels; ++p) {
    for (int64_t o = 0; o < s.out_channels; ++o) {
      const double v = want[p * s.out_channels + o];
      if (v >= 0) want_words[p * words + o / 32] |= 1u << (o % 32);
      const double m = magnitude[p * s.out_channels + o];  // 0: an exact integer value (no epilogue)
      if (m == 0 || std::fabs(v) > m * 1e-6) checked_bits[p * words + o / 32] |= 1u << (o % 32);
    }
    if (s.out_channels % 32 != 0) checked_bits[p * words + words - 1] |= ~0u << (s.out_channels % 32);  // must be 0
  }
  constexpr int64_t kGuard = 64;
  Buffer weights(w_bits.size() * 4), out((pixels * words + 2 * kGuard) * 4);
  CHECK_CUDA(cudaMemcpy(weights.ptr, w_bits.data(), weights.bytes, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(out.ptr, 0xa5, out.bytes));
  uint32_t* const words_out = out.as<uint32_t>() + kGuard;
  Buffer table(bk::conv_tap_table_ints(s) * 4);  // the D_t workspace (Buffer allocates 16 bytes for 0)
  auto launch = [&](int copy, cudaStream_t stream) {
    return bk::launch_binary_conv2d_signs(static_cast<const uint32_t*>(inputs[copy]), weights.as<uint32_t>(), s, ep,
                                          words_out, table.as<int>(), stream, &tuning);
  };
  const cudaError_t first = launch(0, nullptr);
  if (refused(row, args, first)) return row;
  CHECK_CUDA(first);
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<uint32_t> all(out.bytes / 4);
  CHECK_CUDA(cudaMemcpy(all.data(), out.ptr, out.bytes, cudaMemcpyDeviceToHost));
  int64_t bad = 0, first_bad = -1, guard_hits = 0;
  for (int64_t i = 0; i < pixels * words; ++i) {
    if (((all[kGuard + i] ^ want_words[i]) & checked_bits[i]) != 0) {
      if (first_bad < 0) first_bad = i;
      ++bad;
    }
  }
  for (int64_t i = 0; i < kGuard; ++i) guard_hits += (all[i] != 0xa5a5a5a5u) + (all[kGuard + pixels * words + i] != 0xa5a5a5a5u);
  row.ok = bad == 0 && guard_hits == 0;
  row.check = format("%lld of %lld words bad%s", (long long)bad, (long long)(pixels * words),
                     first_bad < 0 ? "" : format(" (first: word %lld got %08x want %08x)", (long long)first_bad,
                                                 all[kGuard + first_bad], want_words[first_bad]).c_str());
  if (guard_hits != 0) row.check += format("; %lld guard words written", (long long)guard_hits);
  row.timing = time_launches(launch, copies, args);
  const double ops = 2.0 * pixels * s.out_channels * s.kernel_h * s.kernel_w * s.channels;
  row.floor_us = std::max(ops / kOpsPerUs, (inputs.buffers[0]->bytes + weights.bytes + pixels * words * 4.0) / kBytesPerUs);
  row.rate = ops / row.timing.us / 1e9;
  return row;
}

Row run_conv(const Args& args) {
  bk::ConvShape s;
  s.batch = args.num("b", 64);
  s.channels = args.num("c", 256);
  s.height = args.num("h", 14);
  s.width = args.num("w", s.height);
  s.out_channels = args.num("oc", s.channels);
  s.kernel_h = args.num("kh", 3);
  s.kernel_w = args.num("kw", s.kernel_h);
  s.stride_h = s.stride_w = args.num("stride", 1);
  s.pad_h = s.pad_w = args.num("pad", 1);
  s.dilation_h = s.dilation_w = args.num("dil", 1);
  s.pad_value = static_cast<int>(args.num("padv", 0));
  s.out_height = (s.height + 2 * s.pad_h - s.dilation_h * (s.kernel_h - 1) - 1) / s.stride_h + 1;
  s.out_width = (s.width + 2 * s.pad_w - s.dilation_w * (s.kernel_w - 1) - 1) / s.stride_w + 1;
  bk::ConvTuning tuning;
  tuning.kernel = static_cast<int>(args.num("kernel", 0));
  tuning.tile = static_cast<int>(args.num("tile", 0));
  tuning.k_groups = static_cast<int>(args.num("kg", 0));
  const bool stray = args.num("stray", 0) != 0;
  const FloatType out = parse_type(args.str("out", "fp16"));
  const bool nchw = args.num("nchw", 0) != 0;
  const bool signs = args.num("signs", 0) != 0;  // launch_binary_conv2d_signs: the values' sign words
  const int epi = static_cast<int>(args.num("epi", 0));
  const int64_t out_offset = args.num("outoff", 0);
  Random random(static_cast<uint64_t>(args.num("seed", 1)));
  const int64_t cw = (s.channels + 31) / 32, taps = s.kernel_h * s.kernel_w;
  Row row;
  row.family = "conv";
  row.shape = format("b=%lld c=%lld %lldx%lld oc=%lld k%lldx%lld s%lld p%lld%s %s", (long long)s.batch,
                     (long long)s.channels, (long long)s.height, (long long)s.width, (long long)s.out_channels,
                     (long long)s.kernel_h, (long long)s.kernel_w, (long long)s.stride_h, (long long)s.pad_h,
                     s.dilation_h != 1 ? format(" d%lld", (long long)s.dilation_h).c_str() : "",
                     args.str("out", "fp16").c_str());
  row.config = "auto";
  if (nchw || epi != 0 || s.pad_value != 0 || out_offset != 0 || stray || tuning.kernel != 0 || signs) {
    row.config = format("%s%s%s%s%s%s", tuning.kernel != 0 ? format("k%d ", tuning.kernel).c_str() : "",
                        signs ? "signs " : "", nchw ? "nchw " : "",
                        epi != 0 ? format("epi=%d ", epi).c_str() : "",
                        s.pad_value != 0 ? format("padv=%d ", s.pad_value).c_str() : "",
                        out_offset != 0 ? format("off=%lld ", (long long)out_offset).c_str() : "");
    if (stray) row.config += "stray";
  }
  if (tuning.tile != 0) {
    row.config = (row.config == "auto" ? std::string() : row.config) + format("tile%d", tuning.tile);
  }
  if (tuning.k_groups != 0) {
    row.config = (row.config == "auto" ? std::string() : row.config) + format(" kg%d", tuning.k_groups);
  }
  row.rate_unit = "POPS";
  const std::vector<uint32_t> x_bits = random_bits(random, s.batch * s.height * s.width, s.channels);
  std::vector<uint32_t> w_bits = random_bits(random, s.out_channels * taps, s.channels);
  if (stray) {  // bits past the last channel in every tap's last word (the reference masks them out)
    for (int64_t r = 0; r < s.out_channels * taps; ++r) w_bits[r * cw + cw - 1] |= ~tail_mask(s.channels, cw - 1);
  }
  std::vector<uint32_t> ref_w = w_bits;
  if (args.num("plant", 0) != 0) ref_w[0] ^= 1u;
  const int64_t pixels = s.batch * s.out_height * s.out_width, plane = s.out_height * s.out_width;
  // epi: y = dot * factor[pixel] * scale[oc or 0] + bias[oc]
  const HarnessEpilogue epilogue(epi, s.out_channels, pixels, random);
  const std::vector<float>&scale = epilogue.scale, &bias = epilogue.bias, &factor = epilogue.factor;
  std::vector<double> want(pixels * s.out_channels), magnitude(want.size(), 0.0);
  std::vector<int64_t> checked;
  for (int64_t p = 0; p < pixels; ++p) {
    const int64_t b = p / plane, oh = p / s.out_width % s.out_height, ow = p % s.out_width;
    for (int64_t o = 0; o < s.out_channels; ++o) {
      int64_t dot = 0;
      for (int64_t t = 0; t < taps; ++t) {
        const int64_t ih = oh * s.stride_h - s.pad_h + t / s.kernel_w * s.dilation_h,
                      iw = ow * s.stride_w - s.pad_w + t % s.kernel_w * s.dilation_w;
        const uint32_t* wt = &ref_w[(o * taps + t) * cw];
        if (ih < 0 || ih >= s.height || iw < 0 || iw >= s.width) {  // padded: s(x) = pad_value on every channel
          int64_t ones = 0;
          for (int64_t w = 0; w < cw; ++w) ones += __builtin_popcount(wt[w] & tail_mask(s.channels, w));
          dot += s.pad_value * (2 * ones - s.channels);
          continue;
        }
        const uint32_t* a = &x_bits[((b * s.height + ih) * s.width + iw) * cw];
        int64_t differ = 0;
        for (int64_t w = 0; w < cw; ++w) differ += __builtin_popcount((a[w] ^ wt[w]) & tail_mask(s.channels, w));
        dot += s.channels - 2 * differ;
      }
      const int64_t index = nchw ? (b * s.out_channels + o) * plane + p % plane : p * s.out_channels + o;
      double y = static_cast<double>(dot);
      if (epi != 0) {
        const double product = y * (factor.empty() ? 1.0 : factor[p]) * scale[scale.size() == 1 ? 0 : o];
        y = product + bias[o];
        magnitude[index] = std::fabs(product) + std::fabs(bias[o]);  // fp32 rounding of the epilogue
      }
      want[index] = y;
      checked.push_back(index);
    }
  }
  // res=1: Epilogue::residual, a tensor of the output's type and layout added to each output after its rounding to
  // that type (eager's add): want = float(round(y)) + r in fp32, then rounded once more by the kernel
  const bool res = args.num("res", 0) != 0;
  const int64_t residual_offset = args.num("resoff", 0);
  std::vector<uint8_t> residual_bytes;
  if (res) {
    if (nchw || signs) {
      row.check = "res=1: channels_last 16- and 32-bit outputs only";
      return row;
    }
    std::vector<float> r(want.size()), r_rounded, y32(want.size()), y_rounded;
    for (auto& v : r) v = static_cast<float>(random.word() % 8192u) / 1024.f - 4.f;
    residual_bytes = encode(r, out, &r_rounded);
    residual_bytes.insert(residual_bytes.begin(), residual_offset * type_size(out), uint8_t{0});
    for (size_t i = 0; i < want.size(); ++i) y32[i] = static_cast<float>(want[i]);
    encode(y32, out, &y_rounded);
    for (const int64_t i : checked) {
      want[i] = static_cast<double>(y_rounded[i] + r_rounded[i]);
      magnitude[i] += std::fabs(r_rounded[i]);
    }
    row.config = (row.config == "auto" ? std::string() : row.config + " ") + "res";
  }
  // pack=1: fp16 activations whose signs are x_bits (magnitudes in [0.5, 1.5)), packed by pack_signs each call
  const bool pack = args.num("pack", 0) != 0;
  std::vector<uint8_t> activations;
  if (pack) {
    std::vector<float> values(s.batch * s.height * s.width * s.channels);
    for (size_t i = 0; i < values.size(); ++i) {
      const size_t pixel = i / s.channels, c = i % s.channels;
      const float magnitude = 0.5f + static_cast<float>(random.word() % 1024u) / 1024.f;
      values[i] = (x_bits[pixel * cw + c / 32] >> (c % 32)) & 1u ? magnitude : -magnitude;
    }
    activations = encode(values, FloatType::kFloat16, nullptr);
    row.config = (row.config == "auto" ? std::string() : row.config + " ") + "pack";
  }
  const size_t input_bytes = pack ? activations.size() : x_bits.size() * 4;
  const int copies = rotating_copies(args, input_bytes);
  Copies inputs(pack ? static_cast<const void*>(activations.data()) : x_bits.data(), input_bytes, copies);
  std::unique_ptr<Copies> residuals(res ? new Copies(residual_bytes.data(), residual_bytes.size(), copies) : nullptr);
  Buffer packed(pack ? x_bits.size() * 4 : 4);
  constexpr int64_t kGuard = 64;  // poisoned elements around the output, which must stay so
  if (signs) {
    if (pack) {
      row.check = "pack=1 with signs=1: not supported";
      return row;
    }
    return conv_sign_words(args, row, s, inputs, copies, w_bits, epilogue.ep, want, magnitude, nchw, tuning);
  }
  const size_t size = type_size(out), out_bytes = want.size() * size;
  Buffer weights(w_bits.size() * 4), y(out_bytes + (out_offset + 2 * kGuard) * size);
  CHECK_CUDA(cudaMemcpy(weights.ptr, w_bits.data(), weights.bytes, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(y.ptr, 0xff, y.bytes));
  uint8_t* const out_ptr = y.as<uint8_t>() + (kGuard + out_offset) * size;
  Buffer table(bk::conv_tap_table_ints(s) * 4);  // the D_t workspace (Buffer allocates 16 bytes for 0)
  // sumw=1: the output's sign words (Epilogue::out_signs), poisoned words around them
  const bool sumw = args.num("sumw", 0) != 0;
  if (sumw && (nchw || signs)) {
    row.check = "sumw=1: channels_last 16- and 32-bit outputs only";
    return row;
  }
  const int64_t sum_words = (s.out_channels + 31) / 32;
  Buffer words_buffer(sumw ? (pixels * sum_words + 2 * kGuard) * 4 : 4);
  if (sumw) CHECK_CUDA(cudaMemset(words_buffer.ptr, 0xa5, words_buffer.bytes));
  auto launch = [&](int copy, cudaStream_t stream) {
    bk::Epilogue ep = epilogue.ep;
    if (res) ep.residual = static_cast<const uint8_t*>((*residuals)[copy]) + residual_offset * size;
    if (sumw) ep.out_signs = words_buffer.as<uint32_t>() + kGuard;
    const uint32_t* bits = static_cast<const uint32_t*>(inputs[copy]);
    bool table_first = false;  // as the op: the D_t table, then the packing (dependent), then the conv
    if (pack) {
      cudaError_t error = bk::launch_conv_tap_table_first(weights.as<uint32_t>(), s, table.as<int>(), stream);
      if (error != cudaSuccess && error != cudaErrorNotSupported) return error;
      table_first = error == cudaSuccess;
      error = bk::launch_pack_signs(inputs[copy], FloatType::kFloat16, s.batch * s.height * s.width, s.channels, false,
                                    packed.as<uint32_t>(), nullptr, nullptr, nullptr, stream, table_first);
      if (error != cudaSuccess) return error;
      bits = packed.as<uint32_t>();
    }
    return bk::launch_binary_conv2d(bits, nullptr, weights.as<uint32_t>(), s, ep, out_ptr, out,
                                    /*out_channels_last=*/!nchw, table.as<int>(), stream, &tuning,
                                    /*weights_ready=*/pack, /*table_ready=*/table_first);
  };
  // expect=reject: kernel=2 on a shape the wgmma kernel does not take
  const cudaError_t first = launch(0, nullptr);
  if (refused(row, args, first)) return row;
  CHECK_CUDA(first);
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<uint8_t> all_bytes(y.bytes);
  CHECK_CUDA(cudaMemcpy(all_bytes.data(), y.ptr, y.bytes, cudaMemcpyDeviceToHost));
  const size_t head = (kGuard + out_offset) * size;
  const std::vector<uint8_t> y_bytes(all_bytes.begin() + head, all_bytes.begin() + head + out_bytes);
  row.ok = check_values(decode(y_bytes, out), want, magnitude, checked, out, row.check);
  size_t guard_hits = 0;
  for (size_t i = 0; i < all_bytes.size(); ++i) guard_hits += (i < head || i >= head + out_bytes) && all_bytes[i] != 0xff;
  if (guard_hits != 0) {
    row.ok = false;
    row.check += format("; %zu bytes written outside the output", guard_hits);
  }
  if (sumw) {  // every word against the signs of the values the kernel stored (bits past OC 0), and the guards
    const std::vector<double> stored = decode(y_bytes, out);
    std::vector<uint32_t> words(words_buffer.bytes / 4);
    CHECK_CUDA(cudaMemcpy(words.data(), words_buffer.ptr, words_buffer.bytes, cudaMemcpyDeviceToHost));
    int64_t bad = 0, first_bad = -1, word_guards = 0;
    uint32_t first_want = 0;
    for (int64_t p = 0; p < pixels; ++p) {
      for (int64_t w = 0; w < sum_words; ++w) {
        uint32_t want_word = 0;
        for (int64_t o = 32 * w; o < std::min<int64_t>(32 * w + 32, s.out_channels); ++o) {
          // a stored -0 counts as >= 0 (pack_signs'); decode gives -0.0 for it, which compares >= 0
          if (stored[p * s.out_channels + o] >= 0) want_word |= 1u << (o % 32);
        }
        if (p == 0 && w == 0 && args.num("plantw", 0) != 0) want_word ^= 1u;  // the check must then say NO
        if (words[kGuard + p * sum_words + w] != want_word) {
          if (first_bad < 0) first_bad = p * sum_words + w, first_want = want_word;
          ++bad;
        }
      }
    }
    for (int64_t i = 0; i < kGuard; ++i) {
      word_guards += (words[i] != 0xa5a5a5a5u) + (words[kGuard + pixels * sum_words + i] != 0xa5a5a5a5u);
    }
    if (bad != 0 || word_guards != 0) row.ok = false;
    row.check += format("; sign words: %lld of %lld bad", (long long)bad, (long long)(pixels * sum_words));
    if (first_bad >= 0) {
      row.check += format(" (first %lld: got %08x want %08x)", (long long)first_bad, words[kGuard + first_bad],
                          first_want);
    }
    if (word_guards != 0) row.check += format(", %lld guard words written", (long long)word_guards);
  }
  row.timing = time_launches(launch, copies, args);
  const double ops = 2.0 * pixels * s.out_channels * taps * s.channels;
  const double bytes = input_bytes + weights.bytes + out_bytes + residual_bytes.size();
  row.floor_us = std::max(ops / kOpsPerUs, bytes / kBytesPerUs);
  row.rate = ops / row.timing.us / 1e9;
  return row;
}

// ---- pack: pack_signs of a [m, k] float matrix -----------------------------------------------------------
// About 1/8 of the values are 0 and 1/16 are -0 (bit 1 for x >= 0; 0 in both planes under sign_zero).
// sign_zero=1: the torch.sign planes (x > 0, x < 0); mean=1: mean |x| per row, against a float64 sum within the
// fp32 bound of a k-term sum; pa=1: the popcount of each row's plus bits (row_popcounts), exact against the
// reference's bits (counted before plant=1 flips one of them, so a planted row fails on the bits alone). xoff: x that
// many elements past a 256-byte aligned pointer (xoff=1: the unaligned fallback). Every output is poisoned first and
// read again after the timed launches: it must be bit-identical (deterministic).
Row run_pack(const Args& args) {
  const int64_t m = args.num("m", 4096), k = args.num("k", 8192);
  const FloatType type = parse_type(args.str("dtype", "bf16"));
  const bool sign_zero = args.num("sign_zero", 0) != 0, mean = args.num("mean", 0) != 0, pa = args.num("pa", 0) != 0;
  const int64_t xoff = args.num("xoff", 0);
  Random random(static_cast<uint64_t>(args.num("seed", 1)));
  const int64_t words = (k + 31) / 32;
  Row row;
  row.family = "pack";
  row.shape = format("m=%lld k=%lld %s", (long long)m, (long long)k, args.str("dtype", "bf16").c_str());
  row.config = format("sz=%d mean=%d xoff=%lld", sign_zero, mean, (long long)xoff);
  if (pa) row.config += " pa";
  std::vector<float> values(m * k), rounded;
  for (auto& v : values) {
    const uint32_t pick = random.word() & 15u;
    v = pick < 2 ? 0.f : (pick == 2 ? -0.f : random.uniform());
  }
  const std::vector<uint8_t> x_bytes = encode(values, type, &rounded);
  std::vector<uint32_t> want(m * words, 0), want_minus(sign_zero ? m * words : 0, 0);
  std::vector<double> want_mean(mean ? m : 0);
  for (int64_t i = 0; i < m; ++i) {
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      const float v = rounded[i * k + j];
      if (sign_zero ? v > 0.f : v >= 0.f) want[i * words + j / 32] |= 1u << (j % 32);
      if (sign_zero && v < 0.f) want_minus[i * words + j / 32] |= 1u << (j % 32);
      sum += std::fabs(static_cast<double>(v));
    }
    if (mean) want_mean[i] = sum / static_cast<double>(k);
  }
  std::vector<int32_t> want_count(pa ? m : 0, 0);
  for (int64_t i = 0; i < static_cast<int64_t>(want_count.size()); ++i) {
    for (int64_t w = 0; w < words; ++w) want_count[i] += __builtin_popcount(want[i * words + w]);
  }
  if (args.num("plant", 0) != 0) want[0] ^= 1u;
  const int copies = rotating_copies(args, x_bytes.size());
  const size_t skip = static_cast<size_t>(xoff) * type_size(type);
  std::vector<uint8_t> padded(skip, 0);
  padded.insert(padded.end(), x_bytes.begin(), x_bytes.end());
  Copies inputs(padded.data(), padded.size(), copies);
  Buffer bits(want.size() * 4), minus_bits(std::max<size_t>(1, want_minus.size()) * 4),
      means(std::max<size_t>(1, want_mean.size()) * 4), counts(std::max<size_t>(1, want_count.size()) * 4);
  CHECK_CUDA(cudaMemset(bits.ptr, 0xa5, bits.bytes));  // poison: an unwritten word differs
  CHECK_CUDA(cudaMemset(minus_bits.ptr, 0xa5, minus_bits.bytes));
  CHECK_CUDA(cudaMemset(means.ptr, 0xff, means.bytes));  // NaN
  CHECK_CUDA(cudaMemset(counts.ptr, 0xa5, counts.bytes));  // negative: no popcount
  auto launch = [&](int copy, cudaStream_t stream) {
    return bk::launch_pack_signs(static_cast<const uint8_t*>(inputs[copy]) + skip, type, m, k, sign_zero,
                                 bits.as<uint32_t>(), sign_zero ? minus_bits.as<uint32_t>() : nullptr,
                                 mean ? means.as<float>() : nullptr, pa ? counts.as<int32_t>() : nullptr, stream);
  };
  CHECK_CUDA(launch(0, nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  auto read = [&](std::vector<uint32_t>& got, std::vector<uint32_t>& got_minus, std::vector<float>& got_mean,
                  std::vector<int32_t>& got_count) {
    got.resize(want.size());
    got_minus.resize(want_minus.size());
    got_mean.resize(want_mean.size());
    got_count.resize(want_count.size());
    CHECK_CUDA(cudaMemcpy(got.data(), bits.ptr, got.size() * 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(got_minus.data(), minus_bits.ptr, got_minus.size() * 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(got_mean.data(), means.ptr, got_mean.size() * 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(got_count.data(), counts.ptr, got_count.size() * 4, cudaMemcpyDeviceToHost));
  };
  std::vector<uint32_t> got, got_minus;
  std::vector<float> got_mean;
  std::vector<int32_t> got_count;
  read(got, got_minus, got_mean, got_count);
  size_t bad = 0, bad_minus = 0, bad_mean = 0, bad_count = 0;
  for (size_t i = 0; i < got.size(); ++i) bad += got[i] != want[i];
  for (size_t i = 0; i < got_minus.size(); ++i) bad_minus += got_minus[i] != want_minus[i];
  for (size_t i = 0; i < got_count.size(); ++i) bad_count += got_count[i] != want_count[i];
  double worst = 0;
  for (size_t i = 0; i < got_mean.size(); ++i) {  // |error| <= k u sum (any order of a k-term fp32 sum) + the divide
    const double allowed = (static_cast<double>(k) + 1) * 6e-8 * want_mean[i] + 1e-30;
    const double error = std::isfinite(got_mean[i]) ? std::fabs(got_mean[i] - want_mean[i]) / allowed : INFINITY;
    bad_mean += !(error <= 1);
    worst = std::max(worst, error);
  }
  row.ok = bad == 0 && bad_minus == 0 && bad_mean == 0 && bad_count == 0;
  row.check = format("%zu of %zu words differ", bad, got.size());
  if (sign_zero) row.check += format(", minus %zu", bad_minus);
  if (mean) row.check += format(", mean %zu bad (worst %.3g of allowed)", bad_mean, worst);
  if (pa) row.check += format(", popcount %zu of %zu rows differ", bad_count, got_count.size());
  row.timing = time_launches(launch, copies, args);
  std::vector<uint32_t> again, again_minus;
  std::vector<float> again_mean;
  std::vector<int32_t> again_count;
  read(again, again_minus, again_mean, again_count);
  const bool same = again == got && again_minus == got_minus && again_count == got_count &&
                    (again_mean.empty() || std::memcmp(again_mean.data(), got_mean.data(), got_mean.size() * 4) == 0);
  if (!same) {
    row.ok = false;
    row.check += "; NOT DETERMINISTIC (outputs changed over the timed launches)";
  }
  const double bytes =
      x_bytes.size() + want.size() * 4.0 + want_minus.size() * 4.0 + want_mean.size() * 4.0 + want_count.size() * 4.0;
  row.floor_us = bytes / kBytesPerUs;
  row.rate = bytes / row.timing.us / 1e6;
  return row;
}

// The read floor (family `read`): a kernel that only reads `bytes` (n x k bits) and XORs them into one word, with
// the launch shapes of the GEMV kernels: `blocks` blocks (0: a block per 64 rows times `cluster`) of `threads`
// threads, `unroll` 16-byte loads in flight a thread, clusters of `cluster` blocks that sync twice before leaving
// (as store_tile), `pdl=1` launched with programmatic stream serialization. What a GEMV pays beyond this is its own.
template <int UNROLL>
__global__ void read_probe_kernel(const uint4* __restrict__ data, int64_t vectors, int cluster, uint32_t* out) {
  uint32_t acc = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (UNROLL - 1) * stride < vectors; i += UNROLL * stride) {
    uint4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) v[u] = __ldg(data + i + u * stride);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < vectors; i += stride) {
    const uint4 v = __ldg(data + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, offset);
  if (cluster > 1) {
    namespace cg = cooperative_groups;
    cg::this_cluster().sync();
    cg::this_cluster().sync();
  }
  if ((threadIdx.x & 31) == 0) atomicXor(out, acc);
}

Row run_read(const Args& args) {
  Row row;
  row.family = "read";
  const int64_t n = args.num("n", 8192), k = args.num("k", 8192);
  const int threads = static_cast<int>(args.num("threads", 128));
  const int unroll = static_cast<int>(args.num("unroll", 8));
  const int cluster = static_cast<int>(args.num("cluster", 1));
  const bool pdl = args.num("pdl", 0) != 0;
  const int64_t vectors = n * k / 128;
  int64_t blocks = args.num("blocks", 0);
  if (blocks <= 0) blocks = (n + 63) / 64 * cluster;
  blocks = (blocks + cluster - 1) / cluster * cluster;
  row.shape = format("n=%lld k=%lld", static_cast<long long>(n), static_cast<long long>(k));
  row.config = format("b=%lld t=%d u=%d c=%d p=%d", static_cast<long long>(blocks), threads, unroll, cluster, pdl);
  Random random(static_cast<uint64_t>(args.num("seed", 1)));
  std::vector<uint32_t> host(static_cast<size_t>(vectors) * 4);
  uint32_t want = 0;
  for (auto& word : host) want ^= (word = random.word());
  if (args.num("plant", 0) != 0) want ^= 1u;
  const int copies = rotating_copies(args, host.size() * 4);
  Copies data(host.data(), host.size() * 4, copies);
  Buffer out(4);
  auto launch = [&](int copy, cudaStream_t stream) {
    const bk::ClusterLaunch launch_shape(dim3(static_cast<unsigned>(blocks)), threads, 0, cluster, stream, pdl);
    const cudaLaunchConfig_t& config = launch_shape.config;
    const uint4* d = static_cast<const uint4*>(data[copy]);
    switch (unroll) {
      case 1: return cudaLaunchKernelEx(&config, read_probe_kernel<1>, d, vectors, cluster, out.as<uint32_t>());
      case 2: return cudaLaunchKernelEx(&config, read_probe_kernel<2>, d, vectors, cluster, out.as<uint32_t>());
      case 4: return cudaLaunchKernelEx(&config, read_probe_kernel<4>, d, vectors, cluster, out.as<uint32_t>());
      case 16: return cudaLaunchKernelEx(&config, read_probe_kernel<16>, d, vectors, cluster, out.as<uint32_t>());
      default: return cudaLaunchKernelEx(&config, read_probe_kernel<8>, d, vectors, cluster, out.as<uint32_t>());
    }
  };
  CHECK_CUDA(cudaMemset(out.ptr, 0, 4));
  CHECK_CUDA(launch(0, nullptr));
  uint32_t got = 0;
  CHECK_CUDA(cudaMemcpy(&got, out.ptr, 4, cudaMemcpyDeviceToHost));
  row.ok = got == want;
  row.check = format("xor %08x, want %08x", got, want);
  row.timing = time_launches(launch, copies, args);
  row.floor_us = static_cast<double>(host.size()) * 4 / kBytesPerUs;
  row.rate = static_cast<double>(host.size()) * 4 / row.timing.us / 1e6;
  return row;
}

Row run_family(const std::string& family, const Args& args) {
  if (family == "w1a16") return run_w1a16(args, false);
  if (family == "apot") return run_w1a16(args, true);
  if (family == "w1a1") return run_w1a1(args);
  if (family == "conv") return run_conv(args);
  if (family == "pack") return run_pack(args);
  if (family == "read") return run_read(args);
  std::fprintf(stderr, "unknown family %s (w1a16, apot, w1a1, conv, pack, read)\n", family.c_str());
  std::exit(2);
}

Row run(const std::string& family, const Args& args) {
  Row row = run_family(family, args);
  row.planted = args.num("plant", 0) != 0 || args.num("plantw", 0) != 0;
  if (row.planted) row.check = (row.ok ? "PLANTED ERROR MISSED: " : "planted error caught: ") + row.check;
  return row;
}
// A row fails when its check failed, or when it passed with an error planted in the reference.
bool failed(const Row& row) { return row.ok == row.planted; }

Args parse(const std::vector<std::string>& words) {
  Args args;
  for (const auto& word : words) {
    const size_t eq = word.find('=');
    if (eq == std::string::npos) {
      std::fprintf(stderr, "expected key=value, got %s\n", word.c_str());
      std::exit(2);
    }
    args.values[word.substr(0, eq)] = word.substr(eq + 1);
  }
  return args;
}

// An empty kernel of one 200 KiB block an SM (as the warp-specialized wgmma kernels), for the cluster rooms the
// header prints: the blocks that clusters of 2-8 hold at once (device_common.cuh's cluster_room), which
// split_k_slices and the cost models of wgmma_ws.cuh plan with.
__global__ void room_probe_kernel() {}
void print_cluster_rooms() {
  constexpr int kSmem = 200 * 1024;
  if (cudaFuncSetAttribute(room_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  static bk::ClusterRoomCache cache = {};
  const bk::ClusterRoom room = bk::cluster_room(room_probe_kernel, 384, kSmem, cache);
  std::printf("# blocks in clusters of 2..8 at once, one 200 KiB block an SM:");
  for (int size = 2; size <= bk::ClusterRoom::kLargest; ++size)
    std::printf(" %d:%lld", size, static_cast<long long>(room.of(size)));
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: harness FAMILY key=value ... | harness --sweep FILE [key=value ...]\n");
    return 2;
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("# %s, %d SMs, L2 %d MiB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  print_cluster_rooms();
  const auto begin = std::chrono::steady_clock::now();
  int failures = 0;
  print_header();
  if (std::string(argv[1]) == "--sweep") {
    if (argc < 3) return 2;
    std::ifstream file(argv[2]);
    if (!file) {
      std::fprintf(stderr, "cannot read %s\n", argv[2]);
      return 2;
    }
    const std::vector<std::string> extra(argv + 3, argv + argc);  // applied to every line (e.g. reps=5)
    std::string line;
    while (std::getline(file, line)) {
      const size_t hash = line.find('#');
      if (hash != std::string::npos) line.resize(hash);
      std::istringstream words(line);
      std::string family, word;
      if (!(words >> family)) continue;
      std::vector<std::string> rest;
      while (words >> word) rest.push_back(word);
      rest.insert(rest.end(), extra.begin(), extra.end());
      const Row row = run(family, parse(rest));
      failures += failed(row);
      print_row(row);
    }
  } else {
    const Row row = run(argv[1], parse(std::vector<std::string>(argv + 2, argv + argc)));
    failures += failed(row);
    print_row(row);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  std::printf("# %d row(s) failed (a planted error that is caught counts as passed); %.1f s\n", failures, seconds);
  return failures == 0 ? 0 : 1;
}
