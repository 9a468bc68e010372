#include "ngram/topk_memo.h"

#include <algorithm>
#include <cstring>

namespace treespec::ngram {

bool TopkMemo::Key::operator==(const Key& o) const {
  return length == o.length && k == o.k &&
         std::equal(tokens, tokens + length, o.tokens);
}

size_t TopkMemo::KeyHash::operator()(const Key& key) const {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(key.length) << 32) ^ static_cast<uint64_t>(key.k);
  for (uint32_t j = 0; j < key.length; ++j) {
    h ^= static_cast<uint32_t>(key.tokens[j]);
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 33;
  }
  return static_cast<size_t>(h);
}

TopkMemo::TopkMemo(size_t max_entries) : max_entries_(std::max<size_t>(max_entries, 1)) {}

const std::vector<Scored>& TopkMemo::topk(const TrieFile& trie, const Cursor& context, int64_t k) {
  if (trie_ != &trie) {
    map_.clear();
    trie_ = &trie;
  }
  Key key;
  std::memset(&key, 0, sizeof(key));
  key.length = context.length;
  key.k = k;
  std::copy(context.tokens, context.tokens + context.length, key.tokens);
  auto it = map_.find(key);
  if (it != map_.end()) {
    ++hits_;
    return it->second;
  }
  ++misses_;
  if (map_.size() >= max_entries_) map_.clear();  // bounded: start over rather than track ages
  return map_.emplace(key, trie.topk(trie.resolve(context), k, nullptr)).first->second;
}

}  // namespace treespec::ngram
