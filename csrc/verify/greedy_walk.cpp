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

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "tree_walk.h"
#include "row_argmax.h"

namespace py = pybind11;

namespace treespec::verify {
namespace {

using I64Array = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

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

// The logits buffer's (rows, vocab, row stride in elements), checked: [R, V >= 1] of float32, or of
// uint16 holding bfloat16 bits, rows strided, elements contiguous.
struct LogitsView {
  const void* ptr;
  int64_t num_rows, vocab, stride;
};

LogitsView logits_view(const char* fn, const py::buffer_info& info, bool bf16) {
  const int64_t item = bf16 ? 2 : 4;
  if (info.ndim != 2 || info.itemsize != item || info.shape[1] < 1 || info.strides[1] != item ||
      info.strides[0] % item != 0)
    throw std::invalid_argument(std::string(fn) + ": logits must be [R, V >= 1] of " +
                                std::string(bf16 ? "bfloat16 bits (uint16)" : "float32") +
                                " with contiguous rows");
  return {info.ptr, info.shape[0], info.shape[1], info.strides[0] / item};
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
  const LogitsView view = logits_view("greedy_tree_walk_logits", info, bf16);
  const int64_t num_rows = view.num_rows, vocab = view.vocab, stride = view.stride;
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
    const auto* base = static_cast<const uint16_t*>(view.ptr);
    return walk_batch(lists, off, tok, b, width, [&](int64_t node) {
      return row_argmax_bf16(base + row_of[node] * stride, vocab);
    });
  }
  const auto* base = static_cast<const float*>(view.ptr);
  return walk_batch(lists, off, tok, b, width, [&](int64_t node) {
    return row_argmax_f32(base + row_of[node] * stride, vocab);
  });
}

// Every row's argmax, with the kernel the walk uses or (portable=true) the portable one: what the
// tests hold to torch.argmax on both paths, whichever the CPU dispatches to.
py::array_t<int64_t> row_argmax(py::buffer logits, bool bf16, bool portable) {
  const py::buffer_info info = logits.request();
  const LogitsView view = logits_view("row_argmax", info, bf16);
  py::array_t<int64_t> out(view.num_rows);
  int64_t* at = out.mutable_data();
  py::gil_scoped_release release;
  for (int64_t r = 0; r < view.num_rows; ++r) {
    if (bf16) {
      const auto* row = static_cast<const uint16_t*>(view.ptr) + r * view.stride;
      at[r] = portable ? row_argmax_bf16_portable(row, view.vocab) : row_argmax_bf16(row, view.vocab);
    } else {
      const auto* row = static_cast<const float*>(view.ptr) + r * view.stride;
      at[r] = portable ? row_argmax_f32_portable(row, view.vocab) : row_argmax_f32(row, view.vocab);
    }
  }
  return out;
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
  m.def("row_argmax", &row_argmax, py::arg("logits"), py::arg("bf16"), py::arg("portable") = false,
        "Each row's argmax [R] as greedy_tree_walk_logits takes it (portable=True: without the "
        "SIMD kernel).");
}

}  // namespace treespec::verify
