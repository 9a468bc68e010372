// Greedy tree acceptance walk: given the target's argmax at every node row, follow the child
// whose token equals it from each root, emitting those tokens and then the bonus token.
//
// The host's greedy rule (vllm_treespec/verify/greedy.py calls it; tests hold it to the torch
// reference in tests/greedy_reference.py), as one O(nodes) pass without the GIL: a torch walk
// issues ~10 small ops per tree level, which on CPU costs more than the whole walk.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "tree_walk.h"

namespace py = pybind11;

namespace treespec::verify {
namespace {

using I64Array = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

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
  py::array_t<int64_t> emitted({b, width}), nodes({b, width}), count(b);
  int64_t* em = emitted.mutable_data();
  int64_t* nd = nodes.mutable_data();
  int64_t* cnt = count.mutable_data();
  {
    py::gil_scoped_release release;
    std::fill(em, em + b * width, -1);
    std::fill(nd, nd + b * width, -1);
    for (int64_t r = 0; r < b; ++r)
      cnt[r] = walk_request(lists, tok, off[r], width, em + r * width, nd + r * width,
                            [&](int64_t row) { return tgt[row]; });
  }
  return py::make_tuple(emitted, nodes, count);
}

}  // namespace

void register_verify(py::module_& m) {
  m.def("greedy_tree_walk", &greedy_tree_walk, py::arg("offsets"), py::arg("tokens"),
        py::arg("parents"), py::arg("target"), py::arg("width"),
        "Greedy tree acceptance from per-row argmax: (emitted [B, W], accepted local nodes "
        "[B, W], num_emitted [B]), -1 padded.");
}

}  // namespace treespec::verify
