// pybind11 submodule vllm_treespec._C.ngram: thin, GIL-releasing wrappers over the n-gram trie.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "ngram/checksum.h"
#include "ngram/counter.h"
#include "ngram/freeze.h"
#include "ngram/online.h"
#include "ngram/topk_memo.h"
#include "ngram/trie.h"
#include "lookup/lookup_trie_tree.h"
#include "lookup/py_batch.h"
#include "tree/trie_ngram.h"

namespace py = pybind11;
using treespec::ngram::Cursor;

namespace treespec::ngram {
namespace {

using I32Array = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;
using treespec::lookup::I32Strict;
using treespec::lookup::I64Strict;
using CursorArray = py::array_t<Cursor, py::array::c_style>;

// The lookup-trie drafter's topk memo of one trie, behind a mutex (the drafting call runs
// without the GIL, so two Python threads may draft from one trie at once).
struct MemoSlot {
  std::mutex mutex;
  TopkMemo memo;
};

// A loaded trie plus this process's optional online layer (the Python class `Trie`).
struct Handle {
  std::shared_ptr<const TrieFile> file;
  std::shared_ptr<OnlineCounts> online;
  std::shared_ptr<treespec::lookup::RecentOutputs> recent;  // outputs searched by lookup_trie_trees
  std::shared_ptr<MemoSlot> memo = std::make_shared<MemoSlot>();
};

int64_t rows_of(const py::array& a, const char* what) {
  if (a.ndim() != 2) throw std::invalid_argument(std::string(what) + " must be a 2-D array [batch, length]");
  return a.shape(0);
}

// Candidates: [K] shared by every row, or [B, K] per row.
struct Candidates {
  const int32_t* data;
  int64_t k;
  bool shared;
  const int32_t* row(int64_t i) const { return shared ? data : data + i * k; }
};

Candidates candidates_of(const I32Array& c, int64_t batch) {
  if (c.ndim() == 1) return {c.data(), c.shape(0), true};
  if (c.ndim() == 2 && c.shape(0) == batch) return {c.data(), c.shape(1), false};
  throw std::invalid_argument("candidates must be [K] or [batch, K] with batch = " + std::to_string(batch));
}

std::vector<Cursor> cursors_from_contexts(const TrieFile& t, const I32Array& contexts) {
  const int64_t b = rows_of(contexts, "contexts"), len = contexts.shape(1);
  std::vector<Cursor> out(static_cast<size_t>(b));
  const int32_t* d = contexts.data();
  for (int64_t i = 0; i < b; ++i) out[i] = t.cursor(d + i * len, len);
  return out;
}

py::object prob_impl(const Handle& h, const Cursor* cur, int64_t b, const Candidates& c, double floor,
                     bool return_orders) {
  py::array_t<double> probs({b, c.k});
  py::array_t<int8_t> orders(return_orders ? std::vector<int64_t>{b, c.k} : std::vector<int64_t>{0});
  double* p = probs.mutable_data();
  int8_t* o = return_orders ? orders.mutable_data() : nullptr;
  std::shared_ptr<OnlineCounts> online = h.online;  // copied under the GIL (enable_online may swap it)
  {
    py::gil_scoped_release release;
    OnlineCounts::ReadLock lock;
    if (online) lock = online->read_lock();
    h.file->prob_batch(cur, b, c.data, c.shared ? 0 : c.k, c.k, floor, online.get(), p, o);
  }
  if (return_orders) return py::make_tuple(probs, orders);
  return std::move(probs);
}

py::tuple topk_impl(const Handle& h, const Cursor* cur, int64_t b, int64_t k) {
  if (k < 0) throw std::invalid_argument("k must be >= 0");
  py::array_t<int32_t> toks({b, k});
  py::array_t<double> probs({b, k});
  py::array_t<int32_t> found(b);
  int32_t* t = toks.mutable_data();
  double* p = probs.mutable_data();
  int32_t* n = found.mutable_data();
  std::shared_ptr<OnlineCounts> online = h.online;  // copied under the GIL (enable_online may swap it)
  {
    py::gil_scoped_release release;
    OnlineCounts::ReadLock lock;
    if (online) lock = online->read_lock();
    for (int64_t i = 0; i < b; ++i) {
      const std::vector<Scored> best = h.file->topk(cur[i], k, online.get());
      for (int64_t j = 0; j < k; ++j) {
        const bool ok = j < static_cast<int64_t>(best.size());
        t[i * k + j] = ok ? best[j].token : -1;
        p[i * k + j] = ok ? best[j].prob : 0.0;
      }
      n[i] = static_cast<int32_t>(best.size());
    }
  }
  return py::make_tuple(toks, probs, found);
}

const Cursor* checked_cursors(const Handle& h, const CursorArray& c) {
  if (c.ndim() != 1) throw std::invalid_argument("cursors must be a 1-D array of CURSOR_DTYPE");
  const Cursor* p = c.data();
  for (int64_t i = 0; i < c.shape(0); ++i) h.file->check_cursor(p[i]);
  return p;
}

// Lookup-trie trees (csrc/lookup/lookup_trie_tree.h) for several rows of vLLM's [rows, max_len]
// int32 token buffer: request i reads the first lengths[i] tokens of row rows[i] and gets at
// most budgets[i] nodes. Returns (tokens, parents, depth int64, logprob, score float64,
// counts int64[B], source int8): one root-first DraftTree block of counts[i] + 1 entries per
// request (source: MixedNode::source, kSourceMatch at the roots).
py::tuple lookup_trie_trees(const Handle& h, const I32Strict& token_ids, const I64Strict& rows,
                            const I64Strict& lengths, const I64Strict& budgets,
                            const treespec::lookup::LookupTrieParams& prm) {
  if (prm.min_n < 1 || prm.max_n < prm.min_n || prm.max_matches < 0 || prm.max_depth < 1 || prm.k < 1 ||
      prm.min_context < 0 || !(prm.lookup_weight >= 0.0 && prm.lookup_weight <= 1.0) ||
      !(prm.min_path_prob >= 0.0 && prm.min_path_prob < 1.0) || prm.recent_max_n < 0 ||
      !(prm.depth_per_match >= 0.0))
    throw std::invalid_argument("lookup_trie_trees: need 1 <= min_n <= max_n, max_matches >= 0, "
                                "max_depth >= 1, k >= 1, min_context >= 0, 0 <= lookup_weight <= 1, "
                                "0 <= min_path_prob < 1, recent_max_ngram >= 0, depth_per_match >= 0");
  treespec::lookup::check_request_batch(token_ids, rows, lengths, budgets);
  const int64_t num = rows.size(), max_len = token_ids.shape(1);
  const int64_t* r = rows.data();
  const int64_t* len = lengths.data();
  std::vector<int64_t> tokens, parents, depth, counts;
  std::vector<double> logprob, score;
  std::vector<int8_t> source;
  std::shared_ptr<OnlineCounts> online = h.online;
  std::shared_ptr<treespec::lookup::RecentOutputs> recent = prm.recent_max_n > 0 ? h.recent : nullptr;
  {
    py::gil_scoped_release release;
    OnlineCounts::ReadLock lock;
    if (online) lock = online->read_lock();
    treespec::lookup::RecentOutputs::ReadLock recent_lock;
    if (recent) recent_lock = recent->read_lock();
    std::lock_guard<std::mutex> memo_lock(h.memo->mutex);
    std::vector<treespec::lookup::MixedNode> nodes;
    for (int64_t i = 0; i < num; ++i) {
      const int32_t* row = token_ids.data() + r[i] * max_len;
      nodes.clear();
      treespec::lookup::propose_lookup_trie_tree(row, len[i], budgets.data()[i], prm, *h.file, online.get(), &nodes,
                                                 &h.memo->memo,  // unused with an online layer
                                                 recent.get());
      tokens.push_back(row[len[i] - 1]), parents.push_back(-1), depth.push_back(0);
      logprob.push_back(0.0), score.push_back(0.0), source.push_back(treespec::lookup::kSourceMatch);
      for (const auto& n : nodes) {
        tokens.push_back(n.token), parents.push_back(n.parent), depth.push_back(n.depth);
        logprob.push_back(n.logprob), score.push_back(n.score), source.push_back(n.source);
      }
      counts.push_back(static_cast<int64_t>(nodes.size()));
    }
  }
  using treespec::lookup::to_numpy;
  return py::make_tuple(to_numpy(std::move(tokens)), to_numpy(std::move(parents)), to_numpy(std::move(depth)),
                        to_numpy(std::move(logprob)), to_numpy(std::move(score)), to_numpy(std::move(counts)),
                        to_numpy(std::move(source)));
}

py::dict header_dict(const TrieFile& t) {
  const Header& h = t.header();
  py::dict d;
  d["format_version"] = h.format_version;
  d["order"] = h.order;
  d["vocab_size"] = h.vocab_size;
  d["count_shift"] = h.count_shift;
  d["min_count"] = h.min_count;
  d["top_threshold"] = h.top_threshold;
  d["top_cap"] = h.top_cap;
  d["file_size"] = h.file_size;
  d["num_nodes"] = h.num_nodes;
  d["num_internal"] = h.num_internal;
  d["num_top_nodes"] = h.num_top_nodes;
  d["num_top_entries"] = h.num_top_entries;
  d["dense_threshold"] = h.dense_threshold;
  d["num_dense_nodes"] = h.num_dense_nodes;
  d["total_tokens"] = h.total_tokens;
  py::list levels;
  for (uint32_t i = 0; i <= h.order; ++i) levels.append(h.level_start[i + 1] - h.level_start[i]);
  d["level_sizes"] = levels;
  py::dict sections;
  for (int s = 0; s < kNumSections; ++s)
    sections[kSectionNames[s]] =
        py::make_tuple(h.section_offset[s], section_elements(h, s) * section_entry_bytes(s));
  d["sections"] = sections;
  d["data_checksum"] = h.data_checksum;
  d["header_checksum"] = h.header_checksum;
  d["tokenizer_fingerprint"] = py::bytes(reinterpret_cast<const char*>(h.tokenizer_fingerprint), 32);
  d["tokenizer_name"] = py::bytes(h.tokenizer_name, strnlen(h.tokenizer_name, sizeof(h.tokenizer_name)));
  return d;
}

py::dict freeze(const std::vector<std::string>& runs, const std::string& out_path, int order, uint32_t vocab_size,
                uint32_t min_count, uint32_t top_threshold, uint32_t top_cap, int64_t dense_threshold,
                const py::bytes& fingerprint,
                const std::string& tokenizer_name, const std::string& tmp_dir, uint64_t memory_bytes,
                int max_count_bits, py::object progress) {
  FreezeOptions o;
  o.order = order;
  o.vocab_size = vocab_size;
  o.min_count = min_count;
  o.top_threshold = top_threshold;
  o.top_cap = top_cap;
  o.dense_threshold = dense_threshold;
  o.max_count_bits = max_count_bits;
  o.tokenizer_name = tokenizer_name;
  o.tmp_dir = tmp_dir;
  o.memory_bytes = memory_bytes;
  const std::string fp = fingerprint;
  if (!fp.empty() && fp.size() != 32) throw std::invalid_argument("fingerprint must be 32 bytes (or empty)");
  std::memcpy(o.fingerprint.data(), fp.data(), fp.size());
  FreezeStats st;
  {
    Progress cb;
    if (!progress.is_none())
      cb = [progress](uint64_t done, uint64_t total) {
        py::gil_scoped_acquire acquire;
        progress(done, total);
      };
    py::gil_scoped_release release;  // destroyed before cb, so cb dies with the GIL held
    st = freeze_runs(runs, out_path, o, cb);
  }
  py::dict d;
  d["total_tokens"] = st.total_tokens;
  d["merged_records"] = st.merged_records;
  d["num_nodes"] = st.num_nodes;
  d["level_sizes"] = st.level_sizes;
  d["file_bytes"] = st.file_bytes;
  d["count_shift"] = st.count_shift;
  d["num_top_nodes"] = st.num_top_nodes;
  d["num_dense_nodes"] = st.num_dense_nodes;
  d["intermediate_merges"] = st.intermediate_merges;
  return d;
}

}  // namespace
}  // namespace treespec::ngram

void register_ngram(py::module_& parent) {
  using namespace treespec::ngram;
  py::module_ m = parent.def_submodule("ngram", "Frozen n-gram trie: build, mmap load, batched queries");
  py::register_exception<TrieFormatError>(m, "TrieFormatError", PyExc_ValueError);
  PYBIND11_NUMPY_DTYPE(Cursor, tokens, nodes, length, reserved);
  m.attr("CURSOR_DTYPE") = py::dtype::of<Cursor>();
  m.attr("FORMAT_VERSION") = kFormatVersion;
  m.attr("HEADER_SIZE") = kHeaderSize;
  m.attr("MAX_ORDER") = kMaxOrder;
  m.attr("MAGIC") = py::bytes(kMagic, 8);

  py::class_<Handle>(m, "Trie", "A frozen trie mapped read-only, plus this process's optional online layer.")
      .def_static(
          "open",
          [](const std::string& path) {
            Handle h;
            {
              py::gil_scoped_release release;
              h.file = TrieFile::open(path);
            }
            return h;
          },
          py::arg("path"), "Map and validate a trie file (O(1) in its size).")
      .def_property_readonly("path", [](const Handle& h) { return h.file->path(); })
      .def_property_readonly("order", [](const Handle& h) { return h.file->order(); })
      .def_property_readonly("vocab_size", [](const Handle& h) { return h.file->header().vocab_size; })
      .def_property_readonly("num_nodes", [](const Handle& h) { return h.file->num_nodes(); })
      .def("header", [](const Handle& h) { return header_dict(*h.file); })
      .def("verify", [](const Handle& h) {
            py::gil_scoped_release release;
            h.file->verify();
          }, "O(file) check of structure, ordering and checksums.")
      .def("touch", [](const Handle& h) {
            py::gil_scoped_release release;
            return h.file->touch();
          }, "Read every page once (warms the page cache).")
      .def("cursors", [](const Handle& h, const I32Array& contexts) {
            const int64_t b = rows_of(contexts, "contexts");
            CursorArray out(b);
            Cursor* o = out.mutable_data();
            {
              py::gil_scoped_release release;
              const std::vector<Cursor> c = cursors_from_contexts(*h.file, contexts);
              std::copy(c.begin(), c.end(), o);
            }
            return out;
          }, py::arg("contexts"), "Cursors of [B, L] contexts (oldest token first; negative = padding).")
      .def("advance", [](const Handle& h, const CursorArray& cursors, const I32Array& tokens) {
            const Cursor* c = checked_cursors(h, cursors);
            const int64_t b = cursors.shape(0);
            if (tokens.ndim() != 1 || tokens.shape(0) != b)
              throw std::invalid_argument("tokens must be 1-D with one token per cursor");
            CursorArray out(b);
            Cursor* o = out.mutable_data();
            const int32_t* t = tokens.data();
            {
              py::gil_scoped_release release;
              for (int64_t i = 0; i < b; ++i) o[i] = h.file->advance(c[i], t[i]);
            }
            return out;
          }, py::arg("cursors"), py::arg("tokens"), "Each cursor extended by one token (new array).")
      .def("prob", [](const Handle& h, const CursorArray& cursors, const I32Array& candidates, double floor,
                      bool return_orders) {
            const Cursor* c = checked_cursors(h, cursors);
            const int64_t b = cursors.shape(0);
            return prob_impl(h, c, b, candidates_of(candidates, b), floor, return_orders);
          }, py::arg("cursors"), py::arg("candidates"), py::arg("floor") = 0.0, py::arg("return_orders") = false)
      .def("prob_contexts", [](const Handle& h, const I32Array& contexts, const I32Array& candidates,
                               double floor, bool return_orders) {
            const int64_t b = rows_of(contexts, "contexts");
            const Candidates c = candidates_of(candidates, b);
            std::vector<Cursor> cur;
            {
              py::gil_scoped_release release;
              cur = cursors_from_contexts(*h.file, contexts);
            }
            return prob_impl(h, cur.data(), b, c, floor, return_orders);
          }, py::arg("contexts"), py::arg("candidates"), py::arg("floor") = 0.0, py::arg("return_orders") = false)
      .def("topk", [](const Handle& h, const CursorArray& cursors, int64_t k) {
            const Cursor* c = checked_cursors(h, cursors);
            return topk_impl(h, c, cursors.shape(0), k);
          }, py::arg("cursors"), py::arg("k"))
      .def("topk_contexts", [](const Handle& h, const I32Array& contexts, int64_t k) {
            const int64_t b = rows_of(contexts, "contexts");
            std::vector<Cursor> cur;
            {
              py::gil_scoped_release release;
              cur = cursors_from_contexts(*h.file, contexts);
            }
            return topk_impl(h, cur.data(), b, k);
          }, py::arg("contexts"), py::arg("k"))
      .def("lookup_trie_trees", [](const Handle& h, const I32Strict& token_ids, const I64Strict& rows,
                                   const I64Strict& lengths, const I64Strict& budgets, int min_n, int max_n,
                                   int max_matches, int max_depth, int k, int min_context,
                                   double lookup_weight, bool chain, double min_path_prob, int recent_max_ngram,
                                   double depth_per_match) {
            treespec::lookup::LookupTrieParams prm;
            prm.recent_max_n = recent_max_ngram, prm.depth_per_match = depth_per_match;
            prm.min_n = min_n, prm.max_n = max_n, prm.max_matches = max_matches, prm.max_depth = max_depth;
            prm.k = k, prm.min_context = min_context, prm.lookup_weight = lookup_weight, prm.chain = chain;
            prm.min_path_prob = min_path_prob;
            return lookup_trie_trees(h, token_ids, rows, lengths, budgets, prm);
          }, py::arg("token_ids"), py::arg("rows"), py::arg("lengths"), py::arg("budgets"), py::arg("min_ngram"),
          py::arg("max_ngram"), py::arg("max_matches"), py::arg("max_depth"), py::arg("k"), py::arg("min_context"),
          py::arg("lookup_weight"), py::arg("chain"), py::arg("min_path_prob") = 0.0,
          py::arg("recent_max_ngram") = 0, py::arg("depth_per_match") = 0.0,
          "Prompt-lookup continuations mixed with this trie's, best-first (csrc/lookup/lookup_trie_tree.h); "
          "recent_max_ngram > 0 also matches the suffix in the recent outputs (enable_recent).")
      .def("scorer", [](const Handle& h, double floor) {
            return std::make_unique<treespec::tree::TrieNgram>(h.file, h.online, floor);
          }, py::arg("floor"),
          "This trie as a C++ NgramScorer (TrieNgram) for the C++ tree builders; it keeps the online "
          "layer active now.")
      .def("enable_online", [](Handle& h, uint64_t capacity_bytes, double weight) {
            h.online = std::make_shared<OnlineCounts>(h.file->order(), capacity_bytes, weight);
          }, py::arg("capacity_bytes"), py::arg("weight"))
      .def("disable_online", [](Handle& h) { h.online.reset(); })
      .def("enable_recent", [](Handle& h, int64_t capacity_tokens) {
            if (capacity_tokens < 64) throw std::invalid_argument("enable_recent: capacity_tokens must be >= 64");
            h.recent = std::make_shared<treespec::lookup::RecentOutputs>(capacity_tokens);
          }, py::arg("capacity_tokens"),
          "Keep recently observed outputs (up to capacity_tokens) for lookup_trie_trees' recent matches.")
      .def("observe", [](const Handle& h, const I32Array& tokens) {
            if (!h.online && !h.recent)
              throw std::invalid_argument("the online layer is off; call enable_online() or enable_recent() first");
            if (tokens.ndim() != 1) throw std::invalid_argument("tokens must be 1-D");
            const int32_t* t = tokens.data();
            const int64_t n = tokens.shape(0);
            const int64_t vocab = h.file->header().vocab_size;
            for (int64_t i = 0; i < n; ++i)
              if (t[i] >= vocab)
                throw std::invalid_argument("token " + std::to_string(t[i]) + " is not below the vocabulary size " +
                                            std::to_string(vocab));
            std::shared_ptr<OnlineCounts> online = h.online;
            std::shared_ptr<treespec::lookup::RecentOutputs> recent = h.recent;
            py::gil_scoped_release release;
            if (online) online->observe(t, n);
            if (recent) recent->observe(t, n);
          }, py::arg("tokens"))
      .def("clear_online", [](const Handle& h) {
            if (h.online) h.online->clear();
            if (h.recent) h.recent->clear();
          })
      .def("recent_stats", [](const Handle& h) -> py::object {
            if (!h.recent) return py::none();
            treespec::lookup::RecentOutputs::ReadLock lock = h.recent->read_lock();
            py::dict d;
            d["capacity_tokens"] = h.recent->capacity_tokens();
            d["held_tokens"] = h.recent->size_tokens();
            d["observed_tokens"] = h.recent->observed_tokens();
            return std::move(d);
          })
      .def("topk_memo_stats", [](const Handle& h) {
            std::lock_guard<std::mutex> lock(h.memo->mutex);
            py::dict d;
            d["hits"] = h.memo->memo.hits();
            d["misses"] = h.memo->memo.misses();
            d["entries"] = h.memo->memo.size();
            return d;
          }, "Hits, misses and entries of the lookup-trie drafter's topk memo of this trie.")
      .def("online_stats", [](const Handle& h) -> py::object {
            if (!h.online) return py::none();
            py::dict d;
            d["slots"] = h.online->num_slots();
            d["used_slots"] = h.online->used_slots();
            d["memory_bytes"] = h.online->memory_bytes();
            d["evictions"] = h.online->evictions();
            d["observed_tokens"] = h.online->observed_tokens();
            d["weight"] = h.online->weight();
            return std::move(d);
          });

  // After bind_tree (csrc/bindings.cpp), which registers the NgramScorer base class.
  py::class_<treespec::tree::TrieNgram, treespec::tree::NgramScorer>(
      m, "TrieNgram",
      "A trie as an n-gram scorer: log P(token | context) with longest-suffix backoff, log(floor) "
      "when no suffix has seen the token. Made by Trie.scorer(floor).")
      .def_property_readonly("floor", &treespec::tree::TrieNgram::floor_value)
      .def_property_readonly("order", [](const treespec::tree::TrieNgram& s) { return s.file().order(); })
      .def_property_readonly("path", [](const treespec::tree::TrieNgram& s) { return s.file().path(); });

  py::class_<NgramCounter>(m, "Counter", "Counts one shard's n-grams within a memory bound, spilling sorted runs.")
      .def(py::init([](int order, uint64_t memory_bytes, const std::string& spill_prefix) {
             return NgramCounter::create(order, memory_bytes, spill_prefix);
           }),
           py::arg("order"), py::arg("memory_bytes"), py::arg("spill_prefix"))
      .def("add", [](NgramCounter& c, const I32Array& tokens) {
            if (tokens.ndim() != 1) throw std::invalid_argument("tokens must be 1-D");
            py::gil_scoped_release release;
            c.add(tokens.data(), tokens.shape(0));
          }, py::arg("tokens"), "Count one stream (n-grams never cross streams).")
      .def("finish", [](NgramCounter& c) {
            py::gil_scoped_release release;
            return c.finish();
          })
      .def_property_readonly("tokens", &NgramCounter::tokens)
      .def_property_readonly("max_token", &NgramCounter::max_token)
      .def_property_readonly("spills", &NgramCounter::spills);

  m.def("freeze", &freeze, py::arg("runs"), py::arg("out_path"), py::arg("order"), py::arg("vocab_size"),
        py::arg("min_count") = 1, py::arg("top_threshold") = 16, py::arg("top_cap") = 32,
        py::arg("dense_threshold") = -1,
        py::arg("fingerprint") = py::bytes(), py::arg("tokenizer_name") = "", py::arg("tmp_dir") = "",
        py::arg("memory_bytes") = 256ull << 20, py::arg("max_count_bits") = 32, py::arg("progress") = py::none(),
        "Merge sorted count runs into a frozen trie file; returns build statistics.");
  m.def("checksum64", [](const py::bytes& b) {
        const std::string s = b;
        return checksum64(s.data(), s.size());
      }, py::arg("data"), "The checksum used in trie headers.");
}
