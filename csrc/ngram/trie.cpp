#include "ngram/trie.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

#include "ngram/checksum.h"

namespace treespec::ngram {

namespace {

constexpr int kFindChunk = 64;  // searches run in lockstep per batch

std::string hex32(uint64_t v) {
  std::ostringstream s;
  s << "0x" << std::hex << v;
  return s.str();
}

// Branch-light lower bound over a sorted token range; returns the index of `t` or -1.
inline int64_t find_token(const int32_t* toks, uint32_t a, uint32_t b, int32_t t) {
  uint32_t n = b - a;
  if (n == 0) return -1;
  const int32_t* lo = toks + a;
  while (n > 1) {
    const uint32_t half = n >> 1;
    lo += static_cast<size_t>(half) & -static_cast<size_t>(lo[half] <= t);
    n -= half;
  }
  return (lo - toks) | -static_cast<int64_t>(*lo != t);  // branch-free: presence is data
}

// Lockstep binary searches of n tokens in one sorted range: out[j] = index of tok[j], or -1.
// Every search takes the same number of steps, so the n searches never diverge and their loads
// are independent: they overlap in the memory system instead of forming n dependent chains.
inline void find_many(const int32_t* toks, uint32_t begin, uint32_t end, const int32_t* tok, int n,
                      int64_t* out) {
  uint32_t width = end - begin;
  if (width == 0) {
    for (int j = 0; j < n; ++j) out[j] = -1;
    return;
  }
  uint32_t lo[kFindChunk];
  for (int j = 0; j < n; ++j) lo[j] = begin;
  while (width > 1) {
    const uint32_t half = width >> 1;
    // A mask, not a conditional: the step stays branch-free whatever the compiler makes of it.
    for (int j = 0; j < n; ++j) lo[j] += half & -static_cast<uint32_t>(toks[lo[j] + half] <= tok[j]);
    width -= half;
  }
  // -1 without a branch on whether the token was found (that is data the predictor cannot learn).
  for (int j = 0; j < n; ++j)
    out[j] = static_cast<int64_t>(lo[j]) | -static_cast<int64_t>(toks[lo[j]] != tok[j]);
}

// Hardware POPCNT where the CPU has it: the baseline x86-64 target does not assume it, so on
// Linux/x86-64 the dense lookups are compiled twice and the loader picks (an ifunc).
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__)
#define TREESPEC_POPCNT_CLONES __attribute__((target_clones("popcnt", "default")))
#else
#define TREESPEC_POPCNT_CLONES
#endif

// Dense-index lookups under one node: pos[j] = the child id of tok[j], or -1. Branch-free (a
// token's presence is data the branch predictor cannot learn); tokens outside the vocabulary read
// word 0 and miss. Returns false if the index names a position past the node's children.
TREESPEC_POPCNT_CLONES
bool dense_many(const uint64_t* bits, const uint32_t* rank, uint32_t begin, uint32_t end, uint32_t vocab,
                const int32_t* tok, int n, int64_t* pos) {
  bool ok = true;
  for (int j = 0; j < n; ++j) {
    const uint32_t t = static_cast<uint32_t>(tok[j]);
    const bool in = t < vocab;
    const uint32_t w = in ? t >> 6 : 0;
    const uint64_t word = bits[w];
    const uint32_t b = t & 63;
    const bool hit = in & static_cast<bool>((word >> b) & 1);
    const uint64_t below = word & ((uint64_t{1} << b) - 1);
    const uint64_t ch = uint64_t{begin} + rank[w] + static_cast<uint64_t>(__builtin_popcountll(below));
    ok &= !hit | (ch < end);
    pos[j] = static_cast<int64_t>(ch) | -static_cast<int64_t>(!hit);
  }
  return ok;
}

// "a ranks before b": higher probability, then smaller token.
__attribute__((always_inline)) inline bool better(const Scored& a, const Scored& b) {
  return a.prob > b.prob || (a.prob == b.prob && a.token < b.token);
}

struct BetterCmp {
  bool operator()(const Scored& a, const Scored& b) const { return better(a, b); }
};

// Heap of the best k so far; front() is the worst kept entry.
inline void heap_offer(std::vector<Scored>& heap, int64_t k, Scored s) {
  if (static_cast<int64_t>(heap.size()) < k) {
    heap.push_back(s);
    std::push_heap(heap.begin(), heap.end(), BetterCmp{});
  } else if (better(s, heap.front())) {
    std::pop_heap(heap.begin(), heap.end(), BetterCmp{});
    heap.back() = s;
    std::push_heap(heap.begin(), heap.end(), BetterCmp{});
  }
}

}  // namespace

// ---------------------------------------------------------------- open and validate

TrieFile::~TrieFile() {
  if (base_ != nullptr) ::munmap(const_cast<uint8_t*>(base_), size_);
}

void TrieFile::corrupt(const std::string& what) const {
  throw TrieFormatError("n-gram trie " + path_ + " is corrupt: " + what +
                        " (rebuild it with `vllm-treespec ngram build`)");
}

std::shared_ptr<const TrieFile> TrieFile::open(const std::string& path) {
  auto fail = [&](const std::string& what) -> TrieFormatError {
    return TrieFormatError("n-gram trie " + path + ": " + what);
  };
  if (!host_is_little_endian()) throw fail("this build runs on a big-endian host; tries are little-endian");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw fail(std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw fail("not a regular file");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < kHeaderSize) {
    char head[8] = {};
    const ssize_t got = size >= 8 ? ::pread(fd, head, 8, 0) : 0;
    ::close(fd);
    if (got == 8 && std::memcmp(head, kMagic, 8) == 0)
      throw fail("truncated: " + std::to_string(size) + " bytes, smaller than the " +
                 std::to_string(kHeaderSize) + "-byte header");
    throw fail("not an n-gram trie file (" + std::to_string(size) + " bytes, no TSNGTRIE header)");
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw fail(std::string("mmap failed: ") + std::strerror(errno));
  ::madvise(p, size, MADV_RANDOM);  // queries touch scattered pages: no readahead
  std::shared_ptr<TrieFile> t(new TrieFile());
  t->path_ = path;
  t->base_ = static_cast<const uint8_t*>(p);
  t->size_ = size;
  t->header_ = reinterpret_cast<const Header*>(p);
  const Header& h = *t->header_;

  if (std::memcmp(h.magic, kMagic, 8) != 0) throw fail("not an n-gram trie file (bad magic)");
  if (h.byte_order_mark != kByteOrderMark) {
    if (h.byte_order_mark == 0x04030201u)
      throw fail("foreign byte order: the file is big-endian but this build reads little-endian "
                 "tries; rebuild it with `vllm-treespec ngram build`");
    throw fail("corrupted header (byte-order mark " + hex32(h.byte_order_mark) + ")");
  }
  if (h.format_version > kFormatVersion)
    throw fail("format version " + std::to_string(h.format_version) +
               " is newer than this vllm_treespec reads (version " + std::to_string(kFormatVersion) +
               "); upgrade vllm_treespec or rebuild the trie");
  if (h.format_version == 0) throw fail("corrupted header (format version 0)");
  if (h.header_size != kHeaderSize)
    throw fail("corrupted header (header size " + std::to_string(h.header_size) + ")");
  if (checksum64(&h, offsetof(Header, header_checksum)) != h.header_checksum)
    throw fail("corrupted header (header checksum mismatch)");
  if (h.file_size > size)
    throw fail("truncated: the header says " + std::to_string(h.file_size) + " bytes but the file has " +
               std::to_string(size));
  if (h.file_size < size)
    throw fail("the file has " + std::to_string(size) + " bytes but its header says " +
               std::to_string(h.file_size) + " (trailing data)");

  auto bad = [&](const std::string& what) { return fail("corrupted header (" + what + ")"); };
  if (h.order < 1 || h.order > static_cast<uint32_t>(kMaxOrder)) throw bad("order " + std::to_string(h.order));
  if (h.vocab_size < 1 || h.vocab_size > static_cast<uint32_t>(INT32_MAX))
    throw bad("vocab size " + std::to_string(h.vocab_size));
  if (h.count_shift > 32) throw bad("count shift " + std::to_string(h.count_shift));
  if (h.flags != 0) throw bad("unknown flags " + hex32(h.flags));
  if (h.top_cap < 1) throw bad("top cap 0");
  if (h.num_nodes < 1 || h.num_nodes > UINT32_MAX) throw bad("node count " + std::to_string(h.num_nodes));
  if (h.level_start[0] != 0 || h.level_start[1] != 1) throw bad("level 0 must hold only the root");
  for (int d = 0; d <= kMaxOrder; ++d)
    if (h.level_start[d] > h.level_start[d + 1]) throw bad("level offsets not ascending");
  for (int d = static_cast<int>(h.order) + 1; d <= kMaxOrder + 1; ++d)
    if (h.level_start[d] != h.num_nodes) throw bad("level offsets beyond the order");
  if (h.num_internal != h.level_start[h.order]) throw bad("internal node count");
  if (h.num_top_nodes > h.num_internal) throw bad("top-list node count");
  if (h.num_top_entries > h.num_nodes) throw bad("top-list entry count");
  if (h.num_dense_nodes > h.num_internal || (h.dense_threshold == 0 && h.num_dense_nodes != 0))
    throw bad("dense node count");

  // Sections: aligned, inside the file, not overlapping.
  std::pair<uint64_t, uint64_t> spans[kNumSections];
  for (int s = 0; s < kNumSections; ++s) {
    const uint64_t off = h.section_offset[s], elems = section_elements(h, s), width = section_entry_bytes(s);
    if (off % kSectionAlign != 0 || off < kHeaderSize || off > size || elems > (size - off) / width)
      throw bad(std::string("section ") + kSectionNames[s] + " at offset " + std::to_string(off) +
                " with " + std::to_string(elems) + " entries lies outside the file");
    spans[s] = {off, off + elems * width};
  }
  std::sort(spans, spans + kNumSections);
  for (int s = 1; s < kNumSections; ++s)
    if (spans[s].first < spans[s - 1].second) throw bad("sections overlap");

  auto at = [&](int s) { return t->base_ + h.section_offset[s]; };
  t->tokens_ = reinterpret_cast<const int32_t*>(at(kTokens));
  t->counts_ = reinterpret_cast<const uint32_t*>(at(kCounts));
  t->first_child_ = reinterpret_cast<const uint32_t*>(at(kFirstChild));
  t->totals_ = reinterpret_cast<const uint32_t*>(at(kTotals));
  t->unigram_index_ = reinterpret_cast<const uint32_t*>(at(kUnigramIndex));
  t->top_nodes_ = reinterpret_cast<const uint32_t*>(at(kTopNodes));
  t->top_offsets_ = reinterpret_cast<const uint32_t*>(at(kTopOffsets));
  t->top_entries_ = reinterpret_cast<const uint32_t*>(at(kTopEntries));
  t->dense_nodes_ = reinterpret_cast<const uint32_t*>(at(kDenseNodes));
  t->dense_rank_ = reinterpret_cast<const uint32_t*>(at(kDenseRank));
  t->dense_bits_ = reinterpret_cast<const uint64_t*>(at(kDenseBits));
  t->words_ = dense_words(h);
  std::memcpy(t->level_start_, h.level_start, sizeof(t->level_start_));
  if (t->first_child_[0] != h.level_start[1] || t->first_child_[h.num_internal] != h.num_nodes)
    t->corrupt("first_child does not span the non-root nodes");
  if (t->top_offsets_[0] != 0 || t->top_offsets_[h.num_top_nodes] != h.num_top_entries)
    t->corrupt("top_offsets do not span top_entries");
  return t;
}

// ---------------------------------------------------------------- node access

// The checks below run on every query; their failure paths (building the message) live out of
// line so that the checks themselves inline into the hot loops.
void TrieFile::bad_children(uint32_t node, int depth, uint32_t a, uint32_t b) const {
  corrupt("children of node " + std::to_string(node) + " [" + std::to_string(a) + ", " + std::to_string(b) +
          ") leave depth " + std::to_string(depth + 1));
}

void TrieFile::bad_unigram(int32_t token, uint32_t v) const {
  corrupt("unigram_index[" + std::to_string(token) + "] = " + std::to_string(v) + " is not a unigram");
}

void TrieFile::bad_dense(uint32_t node) const {
  corrupt("dense index of node " + std::to_string(node) + " names a non-child");
}

inline TrieFile::Range TrieFile::children(uint32_t node, int depth) const {
  const uint32_t a = first_child_[node], b = first_child_[node + 1];
  if (a > b || a < level_start_[depth + 1] || b > level_start_[depth + 2]) bad_children(node, depth, a, b);
  return {a, b};
}

inline uint32_t TrieFile::unigram(int32_t token) const {
  if (static_cast<uint32_t>(token) >= header_->vocab_size) return kNoNode;  // also every negative token
  const uint32_t v = unigram_index_[token];
  if (v != kNoNode && (v < level_start_[1] || v >= level_start_[2])) bad_unigram(token, v);
  return v;
}

// Slot of `node` (depth >= 1, children r) in the dense index, or -1 when it has no bitmap.
inline int64_t TrieFile::dense_slot(uint32_t node, Range r) const {
  if (header_->dense_threshold == 0 || r.end - r.begin < header_->dense_threshold) return -1;
  const uint32_t* end = dense_nodes_ + header_->num_dense_nodes;
  const uint32_t* it = std::lower_bound(dense_nodes_, end, node);
  return it != end && *it == node ? it - dense_nodes_ : -1;
}

// A node with a bitmap answers in O(1) (cursors then skip the binary searches over the widest
// child ranges: the unigrams' children).
uint32_t TrieFile::child(uint32_t node, int depth, int32_t token) const {
  if (depth == 0) return unigram(token);
  const Range r = children(node, depth);
  const int64_t slot = dense_slot(node, r);
  int64_t i;
  if (slot < 0) {
    i = find_token(tokens_, r.begin, r.end, token);
  } else if (!dense_many(dense_bits_ + slot * words_, dense_rank_ + slot * words_, r.begin, r.end,
                         header_->vocab_size, &token, 1, &i)) {
    bad_dense(node);
  }
  return i < 0 ? kNoNode : static_cast<uint32_t>(i);
}

// ---------------------------------------------------------------- cursors

Cursor TrieFile::empty_cursor() const {
  Cursor c;
  std::memset(&c, 0, sizeof(c));
  return c;
}

Cursor TrieFile::advance_tokens(const Cursor& c, int32_t token) const {
  Cursor r = empty_cursor();
  const uint32_t m = header_->order - 1;
  if (token < 0 || m == 0) return r;  // a negative token (padding, unknown) resets the context
  r.length = std::min(c.length + 1, m);
  r.tokens[0] = token;
  for (uint32_t j = 1; j < r.length; ++j) r.tokens[j] = c.tokens[j - 1];
  return r;
}

Cursor TrieFile::advance(const Cursor& c, int32_t token) const {
  Cursor r = advance_tokens(c, token);
  if (r.length == 0) return r;
  r.nodes[0] = unigram(token);
  for (uint32_t j = 1; j < r.length && r.nodes[j - 1] != kNoNode; ++j) {
    const uint32_t prev = c.nodes[j - 1];  // suffix of length j of the old context, depth j
    if (prev == kNoNode) break;
    r.nodes[j] = child(prev, static_cast<int>(j), token);
  }
  return r;
}

Cursor TrieFile::cursor(const int32_t* context, int64_t len) const {
  Cursor c = empty_cursor();
  const int64_t m = header_->order - 1;
  for (int64_t i = std::max<int64_t>(0, len - m); i < len; ++i) c = advance(c, context[i]);
  return c;
}

Cursor TrieFile::token_cursor(const int32_t* context, int64_t len) const {
  Cursor c = empty_cursor();
  const int64_t m = header_->order - 1;
  for (int64_t i = std::max<int64_t>(0, len - m); i < len; ++i) c = advance_tokens(c, context[i]);
  return c;
}

Cursor TrieFile::resolve(const Cursor& c) const {
  int32_t oldest_first[kMaxOrder - 1];
  for (uint32_t j = 0; j < c.length; ++j) oldest_first[j] = c.tokens[c.length - 1 - j];
  return cursor(oldest_first, c.length);
}

void TrieFile::check_cursor(const Cursor& c) const {
  if (c.length > header_->order - 1)
    throw TrieFormatError("cursor has " + std::to_string(c.length) + " context tokens but trie " + path_ +
                          " has order " + std::to_string(header_->order) + "; it belongs to another trie");
  for (uint32_t j = 0; j < c.length; ++j) {
    const uint32_t v = c.nodes[j];
    if (v != kNoNode && (v < level_start_[j + 1] || v >= level_start_[j + 2]))
      throw TrieFormatError("cursor node " + std::to_string(v) + " is not a depth-" + std::to_string(j + 1) +
                            " node of trie " + path_ + "; the cursor belongs to another trie");
  }
}

// ---------------------------------------------------------------- probabilities

TrieFile::Levels TrieFile::levels(const Cursor& c, const OnlineCounts* online) const {
  Levels lv;
  lv.m = static_cast<int>(c.length);
  lv.weight = online ? online->weight() : 0.0;
  uint64_t key = context_key_seed();
  for (int L = 0; L <= lv.m; ++L) {
    if (online && L > 0) key = context_key_extend(key, c.tokens[L - 1]);  // only the online layer needs keys
    lv.node[L] = L == 0 ? 0 : c.nodes[L - 1];
    lv.has_node[L] = L == 0 || lv.node[L] != kNoNode;
    lv.range[L] = lv.has_node[L] ? children(lv.node[L], L) : Range{0, 0};
    lv.bits[L] = nullptr;
    lv.rank[L] = nullptr;
    const int64_t slot = L > 0 && lv.has_node[L] ? dense_slot(lv.node[L], lv.range[L]) : -1;
    if (slot >= 0) {
      lv.bits[L] = dense_bits_ + slot * words_;
      lv.rank[L] = dense_rank_ + slot * words_;
    }
    lv.slot[L] = online ? online->find(key) : nullptr;
    const double static_total = lv.has_node[L] ? static_cast<double>(totals_[lv.node[L]]) : 0.0;
    lv.denom[L] = static_total + lv.weight * (lv.slot[L] ? static_cast<double>(lv.slot[L]->total) : 0.0);
  }
  return lv;
}

void TrieFile::prob(const Cursor& c, const int32_t* cand, int64_t k, double floor,
                    const OnlineCounts* online, double* probs, int8_t* orders) const {
  const Levels lv = levels(c, online);
  if (online == nullptr) {
    prob_static(lv, cand, k, floor, probs, orders);
    return;
  }
  for (int64_t i = 0; i < k; ++i) {  // with an online layer: one candidate at a time
    const int32_t t = cand[i];
    probs[i] = floor;
    if (orders) orders[i] = -1;
    for (int L = lv.m; L >= 0; --L) {
      uint32_t cs = 0;
      if (lv.has_node[L]) {
        const uint32_t ch = L == 0 ? unigram(t) : lookup_one(lv, L, t);
        cs = ch != kNoNode ? counts_[ch] : 0;
      }
      const uint32_t co = lv.slot[L] ? lv.slot[L]->count_of(t) : 0;
      if ((cs == 0 && co == 0) || !(lv.denom[L] > 0.0)) continue;
      probs[i] = (static_cast<double>(cs) + lv.weight * static_cast<double>(co)) / lv.denom[L];
      if (orders) orders[i] = static_cast<int8_t>(L);
      break;
    }
  }
}

// Backoff without the counts: node[i] = the node whose count scores cand[i] and level[i] = the
// suffix length whose total divides it (-1, node 0: floor). All candidates search a level's
// child range together (lookup_many); hits leave the batch, the rest back off. The counts are
// read later (finish), so a caller can overlap their cache misses with other work; their lines
// are prefetched here.
void TrieFile::locate(const Levels& lv, const int32_t* cand, int64_t k, uint32_t* node, int8_t* level) const {
  for (int64_t base = 0; base < k; base += kFindChunk) {
    const int n = static_cast<int>(std::min<int64_t>(kFindChunk, k - base));
    locate_chunk(lv, cand + base, n, node + base, level + base);
  }
}

void TrieFile::locate_chunk(const Levels& lv, const int32_t* cand, int n, uint32_t* node_out,
                            int8_t* level_out) const {
  // Local arrays: stores through the int8_t* outputs could alias anything (char aliasing) and
  // would make the compiler reload every value in the loops below after each store.
  int idx[kFindChunk];
  int32_t tok[kFindChunk];
  int64_t pos[kFindChunk];
  uint32_t node[kFindChunk];
  int8_t level[kFindChunk];
  for (int j = 0; j < n; ++j) {
    idx[j] = j;
    tok[j] = cand[j];
    node[j] = kNoNode;
    level[j] = -1;
  }
  int pending = n;
  for (int L = lv.m; L >= 1 && pending > 0; --L) {
    if (!lv.has_node[L] || !(lv.denom[L] > 0.0)) continue;
    lookup_many(lv, L, tok, pending, pos);
    // Branch-free (masks, not conditionals, which the compiler may turn back into branches):
    // whether a token is a child is data the branch predictor cannot learn.
    int keep = 0;
    for (int j = 0; j < pending; ++j) {
      const uint64_t miss = static_cast<uint64_t>(pos[j] >> 63);  // all ones when absent
      const uint64_t found = static_cast<uint64_t>(pos[j]) & ~miss;
      const int at = idx[j];
      __builtin_prefetch(counts_ + found);
      node[at] = static_cast<uint32_t>(found);                                  // kNoNode when absent
      level[at] = static_cast<int8_t>(static_cast<uint64_t>(L) | miss);  // -1 when absent
      idx[keep] = at;
      tok[keep] = tok[j];
      keep += static_cast<int>(miss & 1);
    }
    pending = keep;
  }
  if (pending > 0 && lv.denom[0] > 0.0) {
    for (int j = 0; j < pending; ++j) {
      const uint32_t u = unigram(tok[j]);
      node[idx[j]] = u;
      level[idx[j]] = u == kNoNode ? int8_t{-1} : int8_t{0};
    }
  }
  std::memcpy(node_out, node, sizeof(uint32_t) * n);
  std::memcpy(level_out, level, n);
}

// probs[i] = count(node[i]) / denominator of level[i], or floor; the division is the reference's.
void TrieFile::finish(const Levels& lv, const uint32_t* __restrict node, const int8_t* __restrict level,
                      int64_t k, double floor, double* __restrict probs, int8_t* __restrict orders) const {
  const uint32_t* counts = counts_;
  for (int64_t i = 0; i < k; ++i) {
    const int L = level[i];
    probs[i] = L < 0 ? floor : static_cast<double>(counts[node[i]]) / lv.denom[L];
  }
  if (orders) std::memcpy(orders, level, static_cast<size_t>(k));
}

// The hot path without an online layer, for one context.
void TrieFile::prob_static(const Levels& lv, const int32_t* cand, int64_t k, double floor, double* probs,
                           int8_t* orders) const {
  uint32_t node[kFindChunk];
  int8_t level[kFindChunk];
  for (int64_t base = 0; base < k; base += kFindChunk) {
    const int n = static_cast<int>(std::min<int64_t>(kFindChunk, k - base));
    locate_chunk(lv, cand + base, n, node, level);
    finish(lv, node, level, n, floor, probs + base, orders ? orders + base : nullptr);
  }
}

// Batched prob() is a software pipeline over the contexts (below). Each stage requests the lines
// the next stage will read, kPipelineDistance contexts ahead, so that while one context is being
// scored the cache misses of the next few are in flight instead of being waited for one by one.
constexpr int64_t kPipelineDistance = 4;
constexpr uint64_t kPrefetchLines = 8;  // of a sorted child range: all of it up to this many lines

// Stage 1: the child offsets and totals of a context's suffix nodes (only hints: a prefetch of a
// bad address never faults, so nothing here needs validating).
void TrieFile::prefetch_nodes(const Cursor& c) const {
  const uint64_t internal = header_->num_internal;
  for (uint32_t j = 0; j < c.length && j < kMaxOrder - 1; ++j) {
    const uint32_t v = c.nodes[j];
    if (v == kNoNode || v >= internal) continue;
    __builtin_prefetch(first_child_ + v);
    __builtin_prefetch(first_child_ + v + 1);
    __builtin_prefetch(totals_ + v);
  }
}

// Stage 2 (levels() has read the offsets, so the child ranges are known): the lines the
// candidates' lookups read first. A dense node: its whole bitmap and rank table when small, else
// each candidate's words. A sorted range: all of it when short, else the probes of the first
// binary-search steps (evenly spaced).
void TrieFile::prefetch_lookups(const Levels& lv, const int32_t* cand, int64_t k) const {
  constexpr uint64_t kLine = 64;
  const uint32_t vocab = header_->vocab_size;
  for (int L = 1; L <= lv.m; ++L) {
    if (!lv.has_node[L]) continue;
    if (lv.bits[L] != nullptr) {
      if (words_ * sizeof(uint64_t) <= 8 * kLine) {
        const char* bits = reinterpret_cast<const char*>(lv.bits[L]);
        const char* rank = reinterpret_cast<const char*>(lv.rank[L]);
        for (uint64_t x = 0; x < words_ * sizeof(uint64_t); x += kLine) __builtin_prefetch(bits + x);
        for (uint64_t x = 0; x < words_ * sizeof(uint32_t); x += kLine) __builtin_prefetch(rank + x);
        continue;
      }
      for (int64_t i = 0; i < k; ++i) {
        const uint32_t t = static_cast<uint32_t>(cand[i]);
        if (t >= vocab) continue;
        __builtin_prefetch(lv.bits[L] + (t >> 6));
        __builtin_prefetch(lv.rank[L] + (t >> 6));
      }
      continue;
    }
    const Range r = lv.range[L];
    if (r.end <= r.begin) continue;
    const uint64_t n = r.end - r.begin, per_line = kLine / sizeof(int32_t);
    if (n <= kPrefetchLines * per_line) {
      for (uint64_t x = r.begin; x < r.end; x += per_line) __builtin_prefetch(tokens_ + x);
      __builtin_prefetch(tokens_ + r.end - 1);
    } else {
      for (uint64_t q = 0; q <= kPrefetchLines; ++q)
        __builtin_prefetch(tokens_ + r.begin + (n - 1) * q / kPrefetchLines);
    }
  }
}

void TrieFile::prob_batch(const Cursor* cur, int64_t b, const int32_t* cand, int64_t stride, int64_t k,
                          double floor, const OnlineCounts* online, double* probs, int8_t* orders) const {
  if (k <= 0) return;
  if (online != nullptr || b <= 1) {  // the online layer has its own (per-candidate) path
    for (int64_t i = 0; i < b; ++i)
      prob(cur[i], cand + i * stride, k, floor, online, probs + i * k, orders ? orders + i * k : nullptr);
    return;
  }
  // Context i passes through prefetch_nodes at step i - 3d, levels() + prefetch_lookups at
  // i - 2d, locate() (which prefetches the counts it will need) at i - d and finish() at step i.
  constexpr int64_t d = kPipelineDistance, ring = 2 * d + 1;  // a context's Levels live 2d steps
  std::vector<Levels> lv(static_cast<size_t>(ring));
  std::vector<uint32_t> node(static_cast<size_t>(ring * k));
  std::vector<int8_t> level(static_cast<size_t>(ring * k));
  for (int64_t s = -3 * d; s < b; ++s) {
    const int64_t a = s + 3 * d, l = s + 2 * d, c = s + d;
    if (a < b) prefetch_nodes(cur[a]);
    if (l >= 0 && l < b) {
      lv[l % ring] = levels(cur[l], nullptr);
      prefetch_lookups(lv[l % ring], cand + l * stride, k);
    }
    if (c >= 0 && c < b)
      locate(lv[c % ring], cand + c * stride, k, &node[(c % ring) * k], &level[(c % ring) * k]);
    if (s >= 0)
      finish(lv[s % ring], &node[(s % ring) * k], &level[(s % ring) * k], k, floor, probs + s * k,
             orders ? orders + s * k : nullptr);
  }
}

// Children of level L for n tokens at once: pos[j] = child node id of tok[j], or -1. Dense nodes
// answer from their bitmap (a corrupt bitmap can name a wrong child but never leave the node's
// children range; verify() checks bitmaps in full); other nodes run lockstep binary searches.
void TrieFile::lookup_many(const Levels& lv, int L, const int32_t* tok, int n, int64_t* pos) const {
  const Range r = lv.range[L];
  if (lv.bits[L] == nullptr) {
    find_many(tokens_, r.begin, r.end, tok, n, pos);
    return;
  }
  if (!dense_many(lv.bits[L], lv.rank[L], r.begin, r.end, header_->vocab_size, tok, n, pos))
    bad_dense(lv.node[L]);
}

uint32_t TrieFile::lookup_one(const Levels& lv, int L, int32_t token) const {
  int64_t pos;
  lookup_many(lv, L, &token, 1, &pos);
  return pos < 0 ? kNoNode : static_cast<uint32_t>(pos);
}

// ---------------------------------------------------------------- top-k

// Marks seen[j] when tok[j] gets its probability from a context longer than `level` (statically
// or through the online layer): such a token is scored there, not here.
void TrieFile::mark_seen_above(const Levels& lv, int level, const OnlineCounts* online, const int32_t* tok,
                               int n, bool* seen) const {
  int64_t pos[kFindChunk];
  for (int up = level + 1; up <= lv.m; ++up) {
    if (lv.has_node[up]) {
      lookup_many(lv, up, tok, n, pos);
      for (int j = 0; j < n; ++j) seen[j] |= pos[j] >= 0;
    }
    if (online && lv.slot[up])
      for (int j = 0; j < n; ++j) seen[j] |= lv.slot[up]->count_of(tok[j]) > 0;
  }
}

void TrieFile::topk_level(const Levels& lv, int L, const OnlineCounts* online, int64_t k,
                          std::vector<Scored>& heap) const {
  const double denom = lv.denom[L];
  const OnlineSlot* slot = lv.slot[L];
  // Continuations the online layer knows at this level (their static count is added in).
  if (slot) {
    int32_t tok[kSlotTokens];
    bool seen[kSlotTokens] = {};
    for (int e = 0; e < kSlotTokens; ++e) tok[e] = slot->tokens[e];
    mark_seen_above(lv, L, online, tok, kSlotTokens, seen);
    for (int e = 0; e < kSlotTokens; ++e) {
      if (slot->counts[e] == 0 || seen[e]) continue;
      const uint32_t ch = !lv.has_node[L] ? kNoNode : L == 0 ? unigram(tok[e]) : lookup_one(lv, L, tok[e]);
      const double cs = ch != kNoNode ? static_cast<double>(counts_[ch]) : 0.0;
      const double score = (cs + lv.weight * static_cast<double>(slot->counts[e])) / denom;
      if (score > 0.0) heap_offer(heap, k, {tok[e], score, static_cast<int8_t>(L)});
    }
  }
  if (!lv.has_node[L]) return;
  const uint32_t node = lv.node[L];
  const Range r = lv.range[L];
  const uint32_t deg = r.end - r.begin;
  // Static children are buffered; a flush drops those a longer context scores (one lockstep
  // search per longer level for the whole buffer) and offers the rest to the heap.
  uint32_t ids[kFindChunk];
  int n = 0;
  auto flush = [&]() {
    int32_t tok[kFindChunk];
    bool seen[kFindChunk] = {};
    for (int j = 0; j < n; ++j) tok[j] = tokens_[ids[j]];
    mark_seen_above(lv, L, online, tok, n, seen);
    for (int j = 0; j < n; ++j)
      if (!seen[j]) heap_offer(heap, k, {tok[j], static_cast<double>(counts_[ids[j]]) / denom, static_cast<int8_t>(L)});
    n = 0;
  };
  // Buffers one child; false tells an ordered scan that no later child can enter the top k
  // (the heap only improves while buffered children wait, so stopping on it is safe).
  auto take = [&](uint32_t ch, bool ordered) -> bool {
    const Scored s{tokens_[ch], static_cast<double>(counts_[ch]) / denom, static_cast<int8_t>(L)};
    if (static_cast<int64_t>(heap.size()) >= k && !better(s, heap.front())) return !ordered;
    if (slot && slot->count_of(s.token) > 0) return true;  // scored above with its online count
    ids[n++] = ch;
    if (n == kFindChunk) flush();
    return true;
  };
  int64_t list = -1;
  if (deg > header_->top_threshold) {
    const uint32_t* end = top_nodes_ + header_->num_top_nodes;
    const uint32_t* it = std::lower_bound(top_nodes_, end, node);
    if (it != end && *it == node) list = it - top_nodes_;
  }
  const uint32_t lo = list >= 0 ? top_offsets_[list] : 0, hi = list >= 0 ? top_offsets_[list + 1] : 0;
  if (lo > hi || hi > header_->num_top_entries) corrupt("top list of node " + std::to_string(node));
  if (lo == hi) {  // no list: few children, scan them all
    for (uint32_t ch = r.begin; ch < r.end; ++ch) take(ch, false);
    flush();
    return;
  }
  bool stopped = false;
  for (uint32_t e = lo; e < hi && !stopped; ++e) {
    const uint32_t ch = top_entries_[e];
    if (ch < r.begin || ch >= r.end)
      corrupt("top list of node " + std::to_string(node) + " names node " + std::to_string(ch));
    stopped = !take(ch, true);
  }
  flush();
  if (stopped || hi - lo >= deg) return;
  // The list ran out before the top k settled: scan the children it does not hold.
  const uint32_t last = top_entries_[hi - 1];
  const uint32_t lc = counts_[last];
  const int32_t lt = tokens_[last];
  for (uint32_t ch = r.begin; ch < r.end; ++ch) {
    const uint32_t cc = counts_[ch];
    if (cc > lc || (cc == lc && tokens_[ch] <= lt)) continue;
    take(ch, false);
  }
  flush();
}

std::vector<Scored> TrieFile::topk(const Cursor& c, int64_t k, const OnlineCounts* online) const {
  std::vector<Scored> heap;
  if (k <= 0) return heap;
  k = std::min<int64_t>(k, static_cast<int64_t>(header_->vocab_size));
  heap.reserve(static_cast<size_t>(std::min<int64_t>(k, 4096)));
  const Levels lv = levels(c, online);
  for (int L = lv.m; L >= 0; --L)
    if (lv.denom[L] > 0.0) topk_level(lv, L, online, k, heap);
  std::sort(heap.begin(), heap.end(), better);
  return heap;
}

// ---------------------------------------------------------------- whole-file checks

void TrieFile::verify_dense() const {
  const Header& h = *header_;
  uint64_t j = 0;
  for (uint32_t d = 1; d < h.order; ++d) {
    for (uint64_t u = level_start_[d]; u < level_start_[d + 1]; ++u) {
      const Range r = children(static_cast<uint32_t>(u), static_cast<int>(d));
      const bool listed = j < h.num_dense_nodes && dense_nodes_[j] == u;
      if (listed != (h.dense_threshold != 0 && r.end - r.begin >= h.dense_threshold))
        corrupt("node " + std::to_string(u) + (listed ? " has" : " lacks") + " a dense index");
      if (!listed) continue;
      const uint64_t* bits = dense_bits_ + j * words_;
      const uint32_t* rank = dense_rank_ + j * words_;
      ++j;
      uint32_t ch = r.begin;
      for (uint64_t w = 0; w < words_; ++w) {
        if (rank[w] != ch - r.begin) corrupt("dense rank of node " + std::to_string(u) + " is wrong");
        uint64_t expect = 0;
        for (; ch < r.end && static_cast<uint64_t>(tokens_[ch]) >> 6 == w; ++ch)
          expect |= uint64_t{1} << (tokens_[ch] & 63);
        if (bits[w] != expect) corrupt("dense bits of node " + std::to_string(u) + " are wrong");
      }
    }
  }
  if (j != h.num_dense_nodes) corrupt("dense_nodes lists nodes out of order");
}

uint64_t TrieFile::touch() const {
  uint64_t sum = 0;
  for (uint64_t off = 0; off < size_; off += 4096) sum += base_[off];
  return sum;
}

void TrieFile::verify() const {
  const Header& h = *header_;
  if (checksum64(base_ + h.header_size, h.file_size - h.header_size) != h.data_checksum)
    corrupt("data checksum mismatch");
  const uint32_t order = h.order;
  if (tokens_[0] != -1) corrupt("root token is not -1");
  for (uint32_t d = 0; d < order; ++d)
    if (first_child_[level_start_[d]] != level_start_[d + 1])
      corrupt("children of depth " + std::to_string(d) + " do not start depth " + std::to_string(d + 1));
  uint32_t top_j = 0;
  for (uint32_t d = 0; d < order; ++d) {
    for (uint64_t u = level_start_[d]; u < level_start_[d + 1]; ++u) {
      const Range r = children(static_cast<uint32_t>(u), static_cast<int>(d));
      uint64_t child_sum = 0;
      for (uint32_t ch = r.begin; ch < r.end; ++ch) {
        const int32_t t = tokens_[ch];
        if (t < 0 || static_cast<uint32_t>(t) >= h.vocab_size)
          corrupt("node " + std::to_string(ch) + " has token " + std::to_string(t) + " outside the vocabulary");
        if (ch > r.begin && tokens_[ch - 1] >= t)
          corrupt("children of node " + std::to_string(u) + " are not sorted by token");
        if (counts_[ch] == 0) corrupt("node " + std::to_string(ch) + " has count 0");
        child_sum += counts_[ch];
      }
      if (h.count_shift == 0 && child_sum > totals_[u])
        corrupt("children counts of node " + std::to_string(u) + " exceed its total");
      const uint32_t deg = r.end - r.begin;
      const bool listed = top_j < h.num_top_nodes && top_nodes_[top_j] == u;
      if (listed != (deg > h.top_threshold))
        corrupt("node " + std::to_string(u) + " with " + std::to_string(deg) + " children " +
                (listed ? "has" : "lacks") + " a top list");
      if (!listed) continue;
      const uint32_t lo = top_offsets_[top_j], hi = top_offsets_[top_j + 1];
      ++top_j;
      const uint32_t cap = u == 0 ? deg : h.top_cap;  // the root ranks all its children
      if (lo > hi || hi > h.num_top_entries || hi - lo != std::min(deg, cap))
        corrupt("top list of node " + std::to_string(u) + " has the wrong size");
      for (uint32_t e = lo; e < hi; ++e) {
        const uint32_t ch = top_entries_[e];
        if (ch < r.begin || ch >= r.end)
          corrupt("top list of node " + std::to_string(u) + " names a non-child");
        if (e > lo) {
          const uint32_t pv = top_entries_[e - 1];
          if (counts_[pv] < counts_[ch] || (counts_[pv] == counts_[ch] && tokens_[pv] >= tokens_[ch]))
            corrupt("top list of node " + std::to_string(u) + " is not ordered");
        }
      }
      const uint32_t last = top_entries_[hi - 1];
      uint32_t ranked = 0;
      for (uint32_t ch = r.begin; ch < r.end; ++ch)
        if (counts_[ch] > counts_[last] || (counts_[ch] == counts_[last] && tokens_[ch] <= tokens_[last]))
          ++ranked;
      if (ranked != hi - lo) corrupt("top list of node " + std::to_string(u) + " misses a top child");
    }
  }
  if (top_j != h.num_top_nodes) corrupt("top_nodes lists nodes out of order");
  verify_dense();
  uint64_t indexed = 0;
  for (uint32_t t = 0; t < h.vocab_size; ++t) {
    const uint32_t v = unigram(static_cast<int32_t>(t));
    if (v == kNoNode) continue;
    ++indexed;
    if (tokens_[v] != static_cast<int32_t>(t)) corrupt("unigram_index[" + std::to_string(t) + "] is wrong");
  }
  if (indexed != level_start_[2] - level_start_[1]) corrupt("unigram_index misses unigrams");
}

}  // namespace treespec::ngram
