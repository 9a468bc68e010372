// RecentOutputs: the outputs this deployment served lately, searchable by a request's suffix.
//
// The online n-gram layer (ngram/online.h) remembers what followed each context of at most
// order-1 tokens; a continuation that depends on a longer context (the rest of a function body
// another request already wrote) is lost in it. This store keeps the tokens themselves, up to a
// fixed capacity (the oldest half is dropped when it is full), with an index from every
// `kAnchor`-token window to the most recent positions that followed it. Positions are absolute
// (tokens ever stored), so dropping tokens leaves the index alone: a query skips positions
// that are gone, and each observe() sweeps a few index buckets for keys whose positions are all
// gone, so neither a drop nor the sweep stalls a step. A query hashes the
// request's last kAnchor tokens, extends each candidate backwards to its true match length (up to
// max_len) and returns the longest matches with their continuations, the same SuffixMatch records
// prompt lookup returns for the request's own text, so one match trie merges both.
//
// Thread safety: observe() and clear() take the writer lock; find() needs a ReadLock.
#pragma once

#include <cstdint>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "lookup/prompt_lookup.h"

namespace treespec::lookup {

class RecentOutputs {
 public:
  static constexpr int kAnchor = 2;          // tokens hashed per index key (the shortest match)
  static constexpr int kPositionsPerKey = 32;  // most recent continuations kept per key

  explicit RecentOutputs(int64_t capacity_tokens);

  // Appends one output (negative tokens break contexts, as the end of an output does).
  void observe(const int32_t* tokens, int64_t n);
  void clear();

  // Matches of the suffix of context[0:n] (length >= max(min_len, kAnchor), capped at max_len),
  // best first (longer match, longer continuation up to k, more recent); at most max_matches.
  // `continuation_start` indexes data(). Caller holds a ReadLock.
  std::vector<SuffixMatch> find(const int32_t* context, int64_t n, int min_len, int max_len, int k,
                                int max_matches) const;
  const int32_t* data() const { return tokens_.data(); }

  int64_t capacity_tokens() const { return capacity_; }
  int64_t size_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  uint64_t observed_tokens() const { return observed_; }
  uint64_t index_keys() const { return index_.size(); }

  using ReadLock = std::shared_lock<std::shared_mutex>;
  ReadLock read_lock() const { return ReadLock(mutex_); }

 private:
  void index_from(int64_t begin);  // index the windows ending before local positions >= begin
  void drop_oldest_half();
  void sweep(size_t buckets);      // erase keys whose positions were all dropped

  int64_t capacity_;
  int64_t base_ = 0;               // absolute position of tokens_[0]
  std::vector<int32_t> tokens_;    // outputs, each followed by -1
  // window hash -> absolute positions after it, oldest first (some may be dropped already)
  std::unordered_map<uint64_t, std::vector<int64_t>> index_;
  size_t sweep_bucket_ = 0;
  uint64_t observed_ = 0;
  mutable std::shared_mutex mutex_;
};

}  // namespace treespec::lookup
