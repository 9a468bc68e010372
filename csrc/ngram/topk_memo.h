// TopkMemo: a static trie's TrieFile::topk answers, remembered by context.
//
// The lookup-trie drafter asks the trie for the top continuations of every drafted node's
// context. Code repeats its contexts (the same two tokens recur across lines, requests and
// steps), and in the engine each fresh topk right after a forward pass is a string of cache
// misses through the mapped file. Without an online layer, topk is a pure function of the
// context's last order-1 tokens, so answers are kept in a bounded map (emptied when full) and a
// repeated context costs one hash probe and no trie access at all.
//
// Contexts here are token-only cursors (TrieFile::token_cursor / advance_tokens): the trie
// nodes are looked up only on a miss. Not for tries with an online layer (their counts move).
// Not thread-safe: callers serialise access (the Python binding holds a mutex per trie).
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "ngram/trie.h"

namespace treespec::ngram {

class TopkMemo {
 public:
  explicit TopkMemo(size_t max_entries = size_t{1} << 14);
  // trie.topk(trie.resolve(context), k, nullptr), from the memo when it has it. The
  // reference stays valid until the next call. A memo serves one trie; another one empties it.
  const std::vector<Scored>& topk(const TrieFile& trie, const Cursor& context, int64_t k);

  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }
  size_t size() const { return map_.size(); }
  void clear() { map_.clear(); }

 private:
  struct Key {
    int32_t tokens[kMaxOrder - 1];
    uint32_t length;
    int64_t k;
    bool operator==(const Key& o) const;
  };
  struct KeyHash {
    size_t operator()(const Key& key) const;
  };
  std::unordered_map<Key, std::vector<Scored>, KeyHash> map_;
  size_t max_entries_;
  const TrieFile* trie_ = nullptr;
  uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace treespec::ngram
