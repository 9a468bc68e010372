// N-gram scorers for the tree builders: log rho(token | context) for candidate tokens.
//
// `NgramScorer` is the interface the C++ builders call (without the GIL, possibly from several
// threads at once, so implementations must be safe for concurrent const calls). The production
// n-gram trie implements it as `TrieNgram` (tree/trie_ngram.h); `TableNgram` is a small
// in-memory table filled from Python, used to test the builders against the Python reference.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace treespec::tree {

class NgramScorer {
 public:
  virtual ~NgramScorer() = default;
  // Longest context suffix (in tokens) the scorer can use; callers pass at most this many.
  virtual int max_context() const = 0;
  // out[i] = log rho(cand[i] | ctx[0..ctx_len)) for i in [0, n). ctx is oldest-first.
  virtual void logprobs(const int32_t* ctx, int ctx_len, const int32_t* cand, int n,
                        double* out) const = 0;
  double logprob(const int32_t* ctx, int ctx_len, int32_t cand) const {
    double v;
    logprobs(ctx, ctx_len, &cand, 1, &v);
    return v;
  }
};

constexpr int kMaxNgramOrder = 8;

// Explicit (context, token) -> log-prob entries with longest-suffix backoff: for context c and
// candidate t, the first stored (suffix of c, t) over suffix lengths min(|c|, order-1) .. 0,
// else `floor`. Same rule as vllm_treespec/tree/ngram_table.py.
class TableNgram final : public NgramScorer {
 public:
  TableNgram(int order, double floor);

  int max_context() const override { return order_ - 1; }
  void logprobs(const int32_t* ctx, int ctx_len, const int32_t* cand, int n,
                double* out) const override;

  // Not thread-safe against concurrent queries; fill before use.
  void add(const int32_t* ctx, int ctx_len, int32_t token, double value);

  int order() const { return order_; }
  double floor_value() const { return floor_; }
  std::size_t size() const { return entries_.size(); }

 private:
  struct CtxKey {
    int32_t len;
    int32_t tok[kMaxNgramOrder - 1];
    bool operator==(const CtxKey& o) const;
  };
  struct CtxHash {
    std::size_t operator()(const CtxKey& k) const;
  };
  static CtxKey make_key(const int32_t* ctx, int len);
  static uint64_t entry_key(int32_t ctx_id, int32_t token) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(ctx_id)) << 32) |
           static_cast<uint32_t>(token);
  }

  int order_;
  double floor_;
  std::unordered_map<CtxKey, int32_t, CtxHash> ctx_ids_;
  std::unordered_map<uint64_t, double> entries_;
};

}  // namespace treespec::tree
