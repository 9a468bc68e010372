// pybind11 helpers shared by the batched drafting entry points that read vLLM's token buffer
// (csrc/bindings.cpp: lookup trees; csrc/ngram/ngram_bindings.cpp: lookup-trie trees).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace treespec::lookup {

namespace py = pybind11;

// Strict variants (no forcecast): a wrong dtype is a TypeError, never a silent copy or a cast.
using I32Strict = py::array_t<int32_t, py::array::c_style>;
using I64Strict = py::array_t<int64_t, py::array::c_style>;

// Request i reads the first lengths[i] tokens of row rows[i] of token_ids [rows, max_len] and
// gets at most budgets[i] draft nodes: shapes, row and length ranges and budgets are checked.
inline void check_request_batch(const I32Strict& token_ids, const I64Strict& rows,
                                const I64Strict& lengths, const I64Strict& budgets) {
  if (token_ids.ndim() != 2) throw std::invalid_argument("token_ids must be 2-D [rows, max_len]");
  if (rows.ndim() != 1 || lengths.ndim() != 1 || budgets.ndim() != 1 ||
      lengths.size() != rows.size() || budgets.size() != rows.size())
    throw std::invalid_argument("rows, lengths and budgets must be 1-D of the same length");
  const int64_t num_rows = token_ids.shape(0), max_len = token_ids.shape(1);
  for (py::ssize_t i = 0; i < rows.size(); ++i) {
    const int64_t row = rows.data()[i], len = lengths.data()[i], budget = budgets.data()[i];
    if (row < 0 || row >= num_rows)
      throw std::out_of_range("request " + std::to_string(i) + ": row " + std::to_string(row) +
                              " is out of range of token_ids with " + std::to_string(num_rows) +
                              " rows");
    if (len < 1 || len > max_len)
      throw std::out_of_range("request " + std::to_string(i) + ": length " + std::to_string(len) +
                              " is out of range 1.." + std::to_string(max_len));
    if (budget < 0)
      throw std::invalid_argument("request " + std::to_string(i) + ": budget " +
                                  std::to_string(budget) + " is negative");
  }
}

// Hands a vector's buffer to numpy without copying (the capsule frees it with the array).
template <class T>
py::array_t<T> to_numpy(std::vector<T>&& v) {
  auto* owned = new std::vector<T>(std::move(v));
  py::capsule free_when_done(owned, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>(static_cast<py::ssize_t>(owned->size()), owned->data(), free_when_done);
}

}  // namespace treespec::lookup
