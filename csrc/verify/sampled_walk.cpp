// Sampled tree acceptance on the host: the target-only rule (vllm_treespec/verify/accept.py,
// accept_target_only) as one O(visited rows x vocab) pass without the GIL, and the per-row draw
// it is made of (sample_target_rows), which the torch walk also uses on CPU for nodes verified
// with the target-only rule, so a request's tokens do not depend on which of the two walks its
// batch took.
//
// Why native: the torch walk issues ~10 small ops per tree level plus a layout pass; at the
// fixture's vocabulary (4096) that is ~0.9 ms per sampled step, several times the arithmetic.
//
// A row is divided by its temperature and cut to its top-k (ties with the k-th largest kept) as
// vllm_treespec/verify/sampling_params.py:process_logits does in float32, then drawn by
// inverse CDF in float64 over exp(x - max) with the node's draw coin (verify/coins.py). Rows of
// requests with top-p or min-p arrive already processed by process_logits at temperature 1
// (verify/rules.py:native_row_inputs): top-p breaks ties in torch's sort order, which is vLLM's.
// Float rounding may differ from torch's vectorised softmax in the last bit, so a coin landing
// within rounding of a CDF step can pick the neighbouring token: the law is the same; tests
// compare with the torch reference away from such steps and statistically.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "tree_walk.h"

namespace py = pybind11;

namespace treespec::verify {
namespace {

using I64Array = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
using F32Array = py::array_t<float, py::array::c_style | py::array::forcecast>;
using F64Array = py::array_t<double, py::array::c_style | py::array::forcecast>;

constexpr float kSamplingEps = 1e-5f;  // vLLM's _SAMPLING_EPS: below it a request is greedy
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// exp(x) for x <= 0 in float32, 0 below exp's normal range (masked tokens are -inf): a
// Cephes-style polynomial (about 1 ulp) with selects the compiler vectorises (baseline SSE2,
// -fno-trapping-math in setup.py); libm's scalar expf was most of a row's time at vocab 4096.
inline float exp_nonpositive(float x) {
  const float clamped = x > -87.0f ? x : -87.0f;
  const float shifted = clamped * 1.44269504088896341f + 12582912.0f;   // round to nearest
  const float n = shifted - 12582912.0f;
  const float r = clamped - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x >= -87.0f ? y * scale : 0.0f;                // 0 for masked (-inf) tokens
}

// max of a row in 8 independent lanes (a plain loop does not vectorise).
float row_max(const float* x, int64_t n) {
  float lanes[8];
  for (int k = 0; k < 8; ++k) lanes[k] = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) lanes[k] = x[i + k] > lanes[k] ? x[i + k] : lanes[k];
  float mx = *std::max_element(lanes, lanes + 8);
  for (; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  return mx;
}

// e[i] = exp(x[i] - mx) for a whole row; returns their float64 sum (softmax's denominator).
double exp_shifted(const float* x, float* e, int64_t n, float mx) {
  for (int64_t i = 0; i < n; ++i) e[i] = exp_nonpositive(x[i] - mx);
  double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) lanes[k] += e[i + k];
  double sum = 0.0;
  for (; i < n; ++i) sum += e[i];
  for (double l : lanes) sum += l;
  return sum;
}

// One request's sampling parameters (SamplingParamsBatch row).
struct RowParams {
  float temperature;
  int64_t top_k;
};

// Scratch buffers reused across the rows of one call (vocab-sized each).
struct Scratch {
  std::vector<float> x, e;
  std::vector<int32_t> order;
};

void apply_top_k(std::vector<float>& x, int64_t k, std::vector<int32_t>& order) {
  order.resize(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::nth_element(order.begin(), order.begin() + (k - 1), order.end(),
                   [&](int32_t a, int32_t b) { return x[a] > x[b]; });
  const float kth = x[order[k - 1]];                 // ties with the k-th largest are kept
  for (float& v : x)
    if (v < kth) v = kNegInf;
}

// The token drawn from one target row with one coin (a sampled row: temperature >= eps).
int64_t draw_row(const float* logits, int64_t vocab, const RowParams& p, double coin, Scratch& s) {
  s.x.resize(vocab);
  for (int64_t i = 0; i < vocab; ++i) s.x[i] = logits[i] / p.temperature;
  if (p.top_k > 0 && p.top_k < vocab) apply_top_k(s.x, p.top_k, s.order);
  // Inverse CDF over the softmax's numerators exp(x - max) (the float32 normalisation would
  // only rescale them): the first token whose running float64 sum exceeds coin x total.
  s.e.resize(vocab);
  const double total = exp_shifted(s.x.data(), s.e.data(), vocab, row_max(s.x.data(), vocab));
  const double target = coin * total;
  double running = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    running += s.e[i];
    if (running > target) return i;
  }
  for (int64_t i = vocab - 1; i > 0; --i)            // coin * total rounded up to total:
    if (s.e[i] > 0.0f) return i;                     // the last token with positive weight
  return 0;
}

// Greedy rows (temperature < eps) belong to the greedy walk (verify/greedy.py): the greedy rule
// has one implementation per device, so these walks refuse them (sampled_only) or skip them.
void check_params(const float* temp, const int64_t* top_k, int64_t n, bool sampled_only) {
  for (int64_t i = 0; i < n; ++i) {
    if (!(temp[i] >= 0.0f)) throw std::invalid_argument("sampling.temperature must be >= 0");
    if (sampled_only && temp[i] < kSamplingEps)
      throw std::invalid_argument("sample_target_rows: a greedy row (temperature < 1e-5); greedy "
                                  "rows are the greedy walk's (verify/greedy.py)");
    if (top_k[i] < -1) throw std::invalid_argument("sampling.top_k must be 0 or -1 (off) or >= 1");
  }
}

void check_same_size(const char* who, int64_t n, std::initializer_list<int64_t> sizes) {
  for (int64_t s : sizes)
    if (s != n) throw std::invalid_argument(std::string(who) + ": parameter arrays must have one entry per request");
}

// tokens [N]: one draw per row of logits [N, V] with that row's parameters and draw coin.
py::array_t<int64_t> sample_target_rows(F32Array logits, F32Array temperature, I64Array top_k,
                                        F64Array coins) {
  if (logits.ndim() != 2) throw std::invalid_argument("sample_target_rows: logits must be [N, V]");
  const int64_t n = logits.shape(0), vocab = logits.shape(1);
  check_same_size("sample_target_rows", n, {temperature.size(), top_k.size(), coins.size()});
  check_params(temperature.data(), top_k.data(), n, /*sampled_only=*/true);
  py::array_t<int64_t> out(n);
  int64_t* tok = out.mutable_data();
  const float* lg = logits.data();
  {
    py::gil_scoped_release release;
    Scratch s;
    for (int64_t i = 0; i < n; ++i) {
      const RowParams p{temperature.data()[i], top_k.data()[i]};
      tok[i] = draw_row(lg + i * vocab, vocab, p, coins.data()[i], s);
    }
  }
  return out;
}

// Target-only acceptance of a flat tree batch: (emitted [B, W], accepted local nodes [B, W],
// num_emitted [B]), -1 padded. Greedy requests are skipped (all -1, num_emitted 0: the caller
// runs the greedy walk for them). coins: the draw coin of every row [T] (rows of greedy requests
// are not read; may be empty when every request is greedy). max_depth < 0: W = deepest + 1.
py::tuple target_only_tree_walk(F32Array logits, I64Array offsets, I64Array tokens,
                                I64Array parents, I64Array depth, F32Array temperature,
                                I64Array top_k, F64Array coins, int64_t max_depth) {
  const int64_t b = offsets.size() - 1, t = tokens.size();
  if (logits.ndim() != 2 || logits.shape(0) != t)
    throw std::invalid_argument("target_only_tree_walk: logits must be [T, V], one row per tree node");
  if (parents.size() != t || (depth.size() != 0 && depth.size() != t))
    throw std::invalid_argument("target_only_tree_walk: tokens/parents/depth must have T entries");
  const int64_t vocab = logits.shape(1);
  check_same_size("target_only_tree_walk", b, {temperature.size(), top_k.size()});
  check_params(temperature.data(), top_k.data(), b, /*sampled_only=*/false);
  const int64_t* off = offsets.data();
  const int64_t* tok = tokens.data();
  const ChildLists lists = check_tree_batch("target_only_tree_walk", off, b, parents.data(), tok,
                                            t, vocab, depth.size() ? depth.data() : nullptr);
  if (max_depth >= 0 && max_depth < lists.max_depth)
    throw std::invalid_argument("max_depth=" + std::to_string(max_depth) +
                                " is smaller than the deepest node (" +
                                std::to_string(lists.max_depth) + ")");
  const int64_t width = (max_depth >= 0 ? max_depth : lists.max_depth) + 1;
  bool any_sampled = false;
  for (int64_t r = 0; r < b; ++r) any_sampled |= temperature.data()[r] >= kSamplingEps;
  if (any_sampled && coins.size() != t)
    throw std::invalid_argument("target_only_tree_walk: coins must have one draw coin per row");
  py::array_t<int64_t> emitted({b, width}), nodes({b, width}), count(b);
  int64_t* em = emitted.mutable_data();
  int64_t* nd = nodes.mutable_data();
  int64_t* cnt = count.mutable_data();
  const float* lg = logits.data();
  const double* coin = coins.data();
  {
    py::gil_scoped_release release;
    std::fill(em, em + b * width, -1);
    std::fill(nd, nd + b * width, -1);
    Scratch s;
    for (int64_t r = 0; r < b; ++r) {
      const RowParams p{temperature.data()[r], top_k.data()[r]};
      if (p.temperature < kSamplingEps) {   // the greedy walk's request: left -1, count 0
        cnt[r] = 0;
        continue;
      }
      cnt[r] = walk_request(lists, tok, off[r], width, em + r * width, nd + r * width,
                            [&](int64_t row) { return draw_row(lg + row * vocab, vocab, p, coin[row], s); });
    }
  }
  return py::make_tuple(emitted, nodes, count);
}

}  // namespace

void register_sampled_walk(py::module_& m) {
  m.def("sample_target_rows", &sample_target_rows, py::arg("logits"), py::arg("temperature"),
        py::arg("top_k"), py::arg("coins"),
        "One token per sampled row of float32 logits [N, V] at that row's temperature and "
        "top-k with its draw coin.");
  m.def("target_only_tree_walk", &target_only_tree_walk, py::arg("logits"), py::arg("offsets"),
        py::arg("tokens"), py::arg("parents"), py::arg("depth"), py::arg("temperature"),
        py::arg("top_k"), py::arg("coins"), py::arg("max_depth"),
        "Target-only sampled tree acceptance: (emitted [B, W], accepted local nodes [B, W], "
        "num_emitted [B]), -1 padded; greedy requests skipped (num_emitted 0).");
}

}  // namespace treespec::verify
