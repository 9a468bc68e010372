// pybind11 module vllm_treespec._C: thin, GIL-releasing wrappers over the C++ cores in csrc/.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "lookup/lookup_tree.h"
#include "lookup/prompt_lookup.h"
#include "lookup/py_batch.h"

namespace py = pybind11;
using treespec::lookup::SuffixMatch;

namespace treespec::tree {
void bind_tree(py::module_& m);  // csrc/tree/tree_bindings.cpp
}

namespace {

using I32Array = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;
using I64Array = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

void check_lookup_params(int min_n, int max_n, int k) {
  if (min_n < 1 || max_n < min_n)
    throw std::invalid_argument("prompt lookup needs 1 <= min_n <= max_n, got min_n=" +
                                std::to_string(min_n) + " max_n=" + std::to_string(max_n));
  if (k < 1) throw std::invalid_argument("prompt lookup needs k >= 1, got k=" + std::to_string(k));
}

// Batched chain proposals straight from vLLM's InputBatch.token_ids_cpu ([max_reqs, max_len]
// int32). rows[i] selects a row, lengths[i] how many of its tokens are real, limits[i] the most
// draft tokens that row may get. Returns ([len(rows), k] int32 padded with -1, [len(rows)] lengths).
py::tuple propose_chain_batch(I32Array token_ids, I64Array rows, I64Array lengths, I64Array limits,
                              int min_n, int max_n, int k) {
  check_lookup_params(min_n, max_n, k);
  if (token_ids.ndim() != 2) throw std::invalid_argument("token_ids must be 2-D [rows, max_len]");
  const int64_t num = rows.size();
  if (lengths.size() != num || limits.size() != num)
    throw std::invalid_argument("rows, lengths and limits must have the same length");
  const int64_t num_rows = token_ids.shape(0), max_len = token_ids.shape(1);
  const int32_t* base = token_ids.data();
  const int64_t* row_ptr = rows.data();
  const int64_t* len_ptr = lengths.data();
  const int64_t* lim_ptr = limits.data();
  for (int64_t i = 0; i < num; ++i) {
    if (row_ptr[i] < 0 || row_ptr[i] >= num_rows || len_ptr[i] < 0 || len_ptr[i] > max_len)
      throw std::out_of_range("row " + std::to_string(i) + " is out of range of token_ids");
  }
  py::array_t<int32_t> drafts({num, static_cast<int64_t>(k)});
  py::array_t<int32_t> counts(num);
  int32_t* d = drafts.mutable_data();
  int32_t* c = counts.mutable_data();
  {
    py::gil_scoped_release release;
    std::fill(d, d + num * k, -1);
    for (int64_t i = 0; i < num; ++i) {
      const int kk = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(k, lim_ptr[i])));
      c[i] = kk == 0 ? 0
                     : treespec::lookup::propose_chain(base + row_ptr[i] * max_len, len_ptr[i],
                                                       min_n, max_n, kk, d + i * k);
    }
  }
  return py::make_tuple(drafts, counts);
}

using treespec::lookup::I32Strict;
using treespec::lookup::I64Strict;
using treespec::lookup::to_numpy;

void check_tree_args(const I32Strict& token_ids, const I64Strict& rows, const I64Strict& lengths,
                     const I64Strict& budgets, int min_n, int max_n, int max_matches,
                     int max_depth) {
  if (min_n < 1 || max_n < min_n)
    throw std::invalid_argument("lookup trees need 1 <= min_ngram <= max_ngram, got min_ngram=" +
                                std::to_string(min_n) + " max_ngram=" + std::to_string(max_n));
  if (max_matches < 1 || max_depth < 1)
    throw std::invalid_argument("lookup trees need max_matches >= 1 and max_depth >= 1, got " +
                                std::to_string(max_matches) + " and " + std::to_string(max_depth));
  treespec::lookup::check_request_batch(token_ids, rows, lengths, budgets);
}

// Flat DraftTree arrays of a batch: each request's block is its root then its draft nodes.
struct FlatTrees {
  std::vector<int64_t> tokens, parents, depth, counts;
  std::vector<int32_t> weight;
  std::vector<float> logprob, score;

  void add(int32_t root, int num_matches, const std::vector<treespec::lookup::TreeNode>& nodes) {
    const size_t base = weight.size();  // index of this block's root
    tokens.push_back(root), parents.push_back(-1), depth.push_back(0);
    weight.push_back(num_matches), logprob.push_back(0.0f), score.push_back(0.0f);
    for (const auto& node : nodes) {
      const double w = node.weight;
      tokens.push_back(node.token), parents.push_back(node.parent), depth.push_back(node.depth);
      weight.push_back(node.weight);
      logprob.push_back(static_cast<float>(std::log(w / weight[base + node.parent])));
      score.push_back(static_cast<float>(std::log(w / num_matches)));
    }
    counts.push_back(static_cast<int64_t>(nodes.size()));
  }
};

// Batched lookup trees straight from vLLM's token buffer ([max_reqs, max_len] int32): request i
// uses the first lengths[i] tokens of row rows[i] and gets at most budgets[i] draft nodes.
// Returns (tokens int64, parents int64, depth int64, weight int32, logprob float32,
// score float32, counts int64[B]); request i's block holds counts[i] + 1 entries, root first,
// laid out as DraftTree arrays (parents local to the block, -1 at the root). weight = matches
// through the node (root: matches used); logprob = log(weight / parent weight), the empirical
// continuation frequency; score = log(weight / root weight).
py::tuple propose_tree_batch(const I32Strict& token_ids, const I64Strict& rows,
                             const I64Strict& lengths, const I64Strict& budgets, int min_n,
                             int max_n, int max_matches, int max_depth, double continue_prob) {
  check_tree_args(token_ids, rows, lengths, budgets, min_n, max_n, max_matches, max_depth);
  if (!(continue_prob > 0.0 && continue_prob <= 1.0))
    throw std::invalid_argument("continue_prob must be in (0, 1], got " + std::to_string(continue_prob));
  const int64_t num = rows.size(), max_len = token_ids.shape(1);
  const int32_t* base = token_ids.data();
  const int64_t* row_ptr = rows.data();
  const int64_t* len_ptr = lengths.data();
  const int64_t* bud_ptr = budgets.data();
  FlatTrees flat;
  {
    py::gil_scoped_release release;
    std::vector<treespec::lookup::TreeNode> nodes;
    for (int64_t i = 0; i < num; ++i) {
      const int32_t* tokens = base + row_ptr[i] * max_len;
      nodes.clear();
      const int used = treespec::lookup::propose_tree(tokens, len_ptr[i], min_n, max_n,
                                                      max_matches, max_depth, bud_ptr[i], &nodes,
                                                      continue_prob);
      flat.add(tokens[len_ptr[i] - 1], used, nodes);
    }
  }
  return py::make_tuple(to_numpy(std::move(flat.tokens)), to_numpy(std::move(flat.parents)),
                        to_numpy(std::move(flat.depth)), to_numpy(std::move(flat.weight)),
                        to_numpy(std::move(flat.logprob)), to_numpy(std::move(flat.score)),
                        to_numpy(std::move(flat.counts)));
}

py::list find_suffix_matches(I32Array tokens, int min_n, int max_n, int k, int max_matches) {
  check_lookup_params(min_n, max_n, k);
  if (tokens.ndim() != 1) throw std::invalid_argument("tokens must be 1-D");
  std::vector<SuffixMatch> found;
  {
    py::gil_scoped_release release;
    found = treespec::lookup::find_suffix_matches(tokens.data(), tokens.size(), min_n, max_n, k,
                                                  max_matches);
  }
  py::list out;
  for (const auto& m : found)
    out.append(py::make_tuple(m.continuation_start, m.match_len, m.continuation_len));
  return out;
}

}  // namespace

void register_ngram(py::module_& m);  // csrc/ngram/ngram_bindings.cpp
namespace treespec::verify {
void register_verify(py::module_& m);          // csrc/verify/greedy_walk.cpp
void register_sampled_walk(py::module_& m);    // csrc/verify/sampled_walk.cpp
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "vllm_treespec native core (prompt lookup; later: n-gram trie, tree builders)";
  m.def("propose_chain_batch", &propose_chain_batch, py::arg("token_ids"), py::arg("rows"),
        py::arg("lengths"), py::arg("limits"), py::arg("min_n"), py::arg("max_n"), py::arg("k"),
        "Prompt-lookup chain drafts for several rows of a [rows, max_len] int32 token buffer.");
  m.def("find_suffix_matches", &find_suffix_matches, py::arg("tokens"), py::arg("min_n"),
        py::arg("max_n"), py::arg("k"), py::arg("max_matches"),
        "Earlier occurrences of the longest suffix n-gram, best first: "
        "list of (continuation_start, match_len, continuation_len).");
  m.def("propose_tree_batch", &propose_tree_batch, py::arg("token_ids"), py::arg("rows"),
        py::arg("lengths"), py::arg("budgets"), py::arg("min_ngram"), py::arg("max_ngram"),
        py::arg("max_matches"), py::arg("max_depth"), py::arg("continue_prob") = 1.0,
        "Prompt-lookup draft trees for several rows of a [rows, max_len] int32 token buffer: "
        "(tokens, parents, depth, weight, logprob, score, counts), one root-first DraftTree "
        "block of counts[i] + 1 entries per request.");
  treespec::tree::bind_tree(m);  // n-gram scorers, tree builders (csrc/tree/)
  register_ngram(m);
  treespec::verify::register_verify(m);  // greedy tree acceptance walk (csrc/verify/)
  treespec::verify::register_sampled_walk(m);  // target-only sampled walk and row draws
}
