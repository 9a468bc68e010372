// Greedy tree acceptance walk: from each root, emit the target's argmax at the current node's
// row and follow the child whose token equals it, then stop with the bonus token.
//
// The host's greedy rule (vllm_treespec/verify/greedy.py calls it; tests hold it to the torch
// reference in tests/greedy_reference.py), as one O(nodes) pass without the GIL: a torch walk
// issues ~10 small ops per tree level, which on CPU costs more than the whole walk.
// Two forms: `greedy_tree_walk` takes the argmax of every node row, taken beforehand;
// `greedy_tree_walk_logits` reads the logits and takes the argmax only at the rows the walk
// visits (each request's accepted path and the row it stops at), so a step that verifies many
// nodes and accepts few does not pay a vocabulary-wide argmax for every node.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "tree_walk.h"

namespace py = pybind11;

namespace treespec::verify {
namespace {

using I64Array = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

// First index of the row's largest value, a NaN counting as the largest (the first NaN wins): the
// rule of torch.argmax and of vLLM's CPU greedy_argmax over float32 logits, whose results the
// walk must reproduce bitwise. load(i) is element i as float32 (bf16 widens exactly). One pass:
// kLanes independent (max, first index) pairs, so the comparisons do not form one long chain;
// lanes are merged by value, then by the smaller index. A NaN never wins a `>` comparison, so
// rows holding one are rescanned for the first NaN (NaN logits are an error upstream; rare).
template <class Load>
int64_t row_argmax(const Load& load, int64_t v) {
  constexpr int kLanes = 8;
  float lane_max[kLanes];
  int64_t lane_at[kLanes];
  bool nan = false;
  for (int k = 0; k < kLanes; ++k) {
    lane_max[k] = -std::numeric_limits<float>::infinity();
    lane_at[k] = v;                       // none yet: any real index is smaller
  }
  int64_t i = 0;
  for (; i + kLanes <= v; i += kLanes)
    for (int k = 0; k < kLanes; ++k) {
      const float x = load(i + k);
      nan |= x != x;
      if (x > lane_max[k] || (lane_at[k] == v && x == lane_max[k])) {
        lane_max[k] = x;
        lane_at[k] = i + k;
      }
    }
  for (int k = 0; i < v; ++i, ++k) {
    const float x = load(i);
    nan |= x != x;
    if (x > lane_max[k] || (lane_at[k] == v && x == lane_max[k])) {
      lane_max[k] = x;
      lane_at[k] = i;
    }
  }
  if (nan)
    for (i = 0; i < v; ++i)
      if (load(i) != load(i)) return i;
  float best = lane_max[0];
  int64_t at = lane_at[0];
  for (int k = 1; k < kLanes; ++k)
    if (lane_max[k] > best || (lane_max[k] == best && lane_at[k] < at)) {
      best = lane_max[k];
      at = lane_at[k];
    }
  return at;
}

// (emitted, nodes, count) arrays of a walk, -1 filled, with pick(global row) naming each token.
template <class Pick>
py::tuple walk_batch(const ChildLists& lists, const int64_t* off, const int64_t* tok, int64_t b,
                     int64_t width, const Pick& pick) {
  py::array_t<int64_t> emitted({b, width}), nodes({b, width}), count(b);
  int64_t* em = emitted.mutable_data();
  int64_t* nd = nodes.mutable_data();
  int64_t* cnt = count.mutable_data();
  {
    py::gil_scoped_release release;
    std::fill(em, em + b * width, -1);
    std::fill(nd, nd + b * width, -1);
    for (int64_t r = 0; r < b; ++r)
      cnt[r] = walk_request(lists, tok, off[r], width, em + r * width, nd + r * width, pick);
  }
  return py::make_tuple(emitted, nodes, count);
}

py::tuple greedy_tree_walk(I64Array offsets, I64Array tokens, I64Array parents, I64Array target,
                           int64_t width) {
  const int64_t b = offsets.size() - 1, t = tokens.size();
  if (b < 1 || parents.size() != t || target.size() != t || width < 1)
    throw std::invalid_argument("greedy_tree_walk: need offsets [B+1], tokens/parents/target [T], width >= 1");
  const int64_t* off = offsets.data();
  const int64_t* tok = tokens.data();
  const int64_t* par = parents.data();
  const int64_t* tgt = target.data();
  const ChildLists lists = check_tree_batch("greedy_tree_walk", off, b, par, tok, t);
  return walk_batch(lists, off, tok, b, width, [&](int64_t row) { return tgt[row]; });
}

// logits: a 2-D buffer [R, V] of float32, or of uint16 holding bfloat16 bits (`bf16`), rows
// strided, elements contiguous; rows [T]: node i's logits row.
py::tuple greedy_tree_walk_logits(I64Array offsets, I64Array tokens, I64Array parents,
                                  py::buffer logits, bool bf16, I64Array rows, int64_t width) {
  const int64_t b = offsets.size() - 1, t = tokens.size();
  if (b < 1 || parents.size() != t || rows.size() != t || width < 1)
    throw std::invalid_argument("greedy_tree_walk_logits: need offsets [B+1], tokens/parents/rows [T], "
                                "width >= 1");
  const py::buffer_info info = logits.request();
  const int64_t item = bf16 ? 2 : 4;
  if (info.ndim != 2 || info.itemsize != item || info.shape[1] < 1 || info.strides[1] != item ||
      info.strides[0] % item != 0)
    throw std::invalid_argument("greedy_tree_walk_logits: logits must be [R, V >= 1] of " +
                                std::string(bf16 ? "bfloat16 bits (uint16)" : "float32") +
                                " with contiguous rows");
  const int64_t num_rows = info.shape[0], vocab = info.shape[1], stride = info.strides[0] / item;
  const int64_t* off = offsets.data();
  const int64_t* tok = tokens.data();
  const int64_t* row_of = rows.data();
  for (int64_t i = 0; i < t; ++i)
    if (row_of[i] < 0 || row_of[i] >= num_rows)
      throw std::invalid_argument("greedy_tree_walk_logits: node " + std::to_string(i) +
                                  " names logits row " + std::to_string(row_of[i]) + " of " +
                                  std::to_string(num_rows));
  const ChildLists lists = check_tree_batch("greedy_tree_walk_logits", off, b, parents.data(), tok, t);
  if (bf16) {
    const auto* base = static_cast<const uint16_t*>(info.ptr);
    return walk_batch(lists, off, tok, b, width, [&](int64_t node) {
      const uint16_t* row = base + row_of[node] * stride;
      return row_argmax([row](int64_t j) {
        const uint32_t bits = static_cast<uint32_t>(row[j]) << 16;
        float x;
        std::memcpy(&x, &bits, sizeof x);
        return x;
      }, vocab);
    });
  }
  const auto* base = static_cast<const float*>(info.ptr);
  return walk_batch(lists, off, tok, b, width, [&](int64_t node) {
    const float* row = base + row_of[node] * stride;
    return row_argmax([row](int64_t j) { return row[j]; }, vocab);
  });
}

}  // namespace

void register_verify(py::module_& m) {
  m.def("greedy_tree_walk", &greedy_tree_walk, py::arg("offsets"), py::arg("tokens"),
        py::arg("parents"), py::arg("target"), py::arg("width"),
        "Greedy tree acceptance from per-row argmax: (emitted [B, W], accepted local nodes "
        "[B, W], num_emitted [B]), -1 padded.");
  m.def("greedy_tree_walk_logits", &greedy_tree_walk_logits, py::arg("offsets"), py::arg("tokens"),
        py::arg("parents"), py::arg("logits"), py::arg("bf16"), py::arg("rows"), py::arg("width"),
        "greedy_tree_walk taking the argmax of each visited node's logits row (float32, or "
        "bfloat16 bits as uint16 with bf16=True; rows[i] = node i's row) as torch.argmax does.");
}

}  // namespace treespec::verify
