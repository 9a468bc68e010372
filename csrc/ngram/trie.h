// TrieFile: a frozen n-gram trie (format.h) mapped read-only, and its queries.
//
// Opening validates the header and every section bound in O(1), so load time does not depend on
// the file size; node-level data are checked lazily, on the path a query takes (every index is
// range-checked before it is dereferenced; a violation throws TrieFormatError naming the file).
// verify() is the optional O(file) pass: structure, ordering and the data checksum.
//
// Probabilities use longest-context backoff (DART App. C): a candidate token t after context c
// takes P(t | u) = count(u t) / total(u) from the longest suffix u of c (at most order-1 tokens)
// whose trie node has t as a child; with an online layer, count and total become
// count + weight * online_count and total + weight * online_total, and a suffix "contains" t when
// the merged count is positive. Tokens no suffix contains (never seen, or pruned everywhere down to
// the unigram) get `floor`. Scores are not renormalised across backoff levels (as in DART).
//
// Queries are const and touch only the immutable mapping (plus the online layer under its read
// lock), so any number of threads may query one TrieFile concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ngram/format.h"
#include "ngram/online.h"

namespace treespec::ngram {

class TrieFormatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The state of a context for incremental queries: its last (up to order-1) tokens and the trie
// nodes of its suffixes. A plain 64-byte value; copy it to fork a beam.
struct Cursor {
  int32_t tokens[kMaxOrder - 1];  // tokens[0] is the newest token, tokens[j] is j tokens back
  uint32_t nodes[kMaxOrder - 1];  // nodes[j]: node of the suffix of length j+1, kNoNode if absent
  uint32_t length;                // valid entries in tokens (<= order-1)
  uint32_t reserved;              // 0
};
static_assert(sizeof(Cursor) == 64, "Cursor is a 64-byte value");

struct Scored {
  int32_t token;
  double prob;
  int8_t order = -1;  // suffix length whose count scored it (prob()'s `orders`)
};

class TrieFile {
 public:
  // Maps and validates `path`; throws TrieFormatError with the path and the problem.
  static std::shared_ptr<const TrieFile> open(const std::string& path);
  ~TrieFile();
  TrieFile(const TrieFile&) = delete;
  TrieFile& operator=(const TrieFile&) = delete;

  const Header& header() const { return *header_; }
  const std::string& path() const { return path_; }
  int order() const { return static_cast<int>(header_->order); }
  uint64_t num_nodes() const { return header_->num_nodes; }

  // Full O(file) check of structure, ordering and checksums; throws TrieFormatError.
  void verify() const;
  // Reads every page once (warms the page cache; used to test sharing). Returns a byte sum.
  uint64_t touch() const;

  Cursor empty_cursor() const;
  // Cursor of a context (oldest token first); negative tokens mean "no token" (padding).
  Cursor cursor(const int32_t* context, int64_t len) const;
  Cursor advance(const Cursor& c, int32_t token) const;
  // Token-only cursors (tokens / length set, nodes left absent): the same context rules as
  // cursor() / advance() without the node lookups, for callers that look nodes up only when
  // they need them (topk_memo.h); resolve() fills in the nodes.
  Cursor token_cursor(const int32_t* context, int64_t len) const;
  Cursor advance_tokens(const Cursor& c, int32_t token) const;
  Cursor resolve(const Cursor& c) const;
  // Throws TrieFormatError unless every node of `c` is a valid node of the right depth.
  void check_cursor(const Cursor& c) const;

  // probs[i] (and orders[i] = suffix length used, -1 for floor; orders may be null).
  void prob(const Cursor& c, const int32_t* candidates, int64_t k, double floor,
            const OnlineCounts* online, double* probs, int8_t* orders) const;
  // prob() for b contexts: candidates of context i at cand + i * cand_stride (stride 0: shared),
  // outputs at probs + i * k (and orders + i * k). Without an online layer, the memory each
  // context needs is prefetched a few contexts ahead, so the contexts' cache misses overlap.
  void prob_batch(const Cursor* cur, int64_t b, const int32_t* cand, int64_t cand_stride, int64_t k,
                  double floor, const OnlineCounts* online, double* probs, int8_t* orders) const;
  // The k most probable next tokens (by prob(), ties by smaller token), best first.
  std::vector<Scored> topk(const Cursor& c, int64_t k, const OnlineCounts* online) const;

  // Node accessors (bounds-checked) used by queries and tools.
  uint32_t child(uint32_t node, int depth, int32_t token) const;

  struct Range {
    uint32_t begin, end;
  };

 private:
  TrieFile() = default;
  [[noreturn]] void corrupt(const std::string& what) const;
  [[noreturn, gnu::cold, gnu::noinline]] void bad_children(uint32_t node, int depth, uint32_t a,
                                                           uint32_t b) const;
  [[noreturn, gnu::cold, gnu::noinline]] void bad_unigram(int32_t token, uint32_t v) const;
  [[noreturn, gnu::cold, gnu::noinline]] void bad_dense(uint32_t node) const;

  // Everything a query needs about each suffix length L = 0..m of one context.
  struct Levels {
    int m;                                 // longest suffix length (cursor length)
    double weight;                         // online weight (0 without a layer)
    bool has_node[kMaxOrder];              // the static trie has this suffix
    uint32_t node[kMaxOrder];
    Range range[kMaxOrder];                // its children
    double denom[kMaxOrder];               // total + weight * online total
    const OnlineSlot* slot[kMaxOrder];     // online counts of this suffix, or null
    const uint64_t* bits[kMaxOrder];       // dense index of the node, or null
    const uint32_t* rank[kMaxOrder];
  };
  Levels levels(const Cursor& c, const OnlineCounts* online) const;
  Range children(uint32_t node, int depth) const;
  int64_t dense_slot(uint32_t node, Range r) const;
  void lookup_many(const Levels& lv, int level, const int32_t* tok, int n, int64_t* pos) const;
  uint32_t lookup_one(const Levels& lv, int level, int32_t token) const;
  void verify_dense() const;
  uint32_t unigram(int32_t token) const;
  void prefetch_nodes(const Cursor& c) const;
  void prefetch_lookups(const Levels& lv, const int32_t* cand, int64_t k) const;
  void locate(const Levels& lv, const int32_t* cand, int64_t k, uint32_t* node, int8_t* level) const;
  void locate_chunk(const Levels& lv, const int32_t* cand, int n, uint32_t* node, int8_t* level) const;
  void finish(const Levels& lv, const uint32_t* node, const int8_t* level, int64_t k, double floor,
              double* probs, int8_t* orders) const;
  void prob_static(const Levels& lv, const int32_t* cand, int64_t k, double floor, double* probs,
                   int8_t* orders) const;
  void mark_seen_above(const Levels& lv, int level, const OnlineCounts* online, const int32_t* tok, int n,
                       bool* seen) const;
  void topk_level(const Levels& lv, int level, const OnlineCounts* online, int64_t k,
                  std::vector<Scored>& heap) const;

  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  const Header* header_ = nullptr;
  const int32_t* tokens_ = nullptr;
  const uint32_t* counts_ = nullptr;
  const uint32_t* first_child_ = nullptr;
  const uint32_t* totals_ = nullptr;
  const uint32_t* unigram_index_ = nullptr;
  const uint32_t* top_nodes_ = nullptr;
  const uint32_t* top_offsets_ = nullptr;
  const uint32_t* top_entries_ = nullptr;
  const uint32_t* dense_nodes_ = nullptr;
  const uint32_t* dense_rank_ = nullptr;
  const uint64_t* dense_bits_ = nullptr;
  uint64_t words_ = 0;  // 64-token words per dense bitmap
  uint64_t level_start_[kMaxOrder + 2] = {};
};

}  // namespace treespec::ngram
