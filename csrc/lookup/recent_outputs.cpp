#include "lookup/recent_outputs.h"

#include <algorithm>
#include <mutex>

#include "ngram/online.h"

namespace treespec::lookup {

namespace {

// The online layer's context hash (ngram/online.h), over the window read oldest token first.
uint64_t window_key(const int32_t* w) {
  uint64_t h = ngram::context_key_seed();
  for (int i = 0; i < RecentOutputs::kAnchor; ++i) h = ngram::context_key_extend(h, w[i]);
  return h;
}

}  // namespace

RecentOutputs::RecentOutputs(int64_t capacity_tokens)
    : capacity_(std::max<int64_t>(capacity_tokens, 64)) {
  tokens_.reserve(static_cast<size_t>(capacity_));
  index_.reserve(static_cast<size_t>(capacity_ / 2));  // no rehash (a stall) as the store fills
}

void RecentOutputs::index_from(int64_t begin) {
  // Local position p (the token after window tokens_[p - kAnchor .. p - 1]) is indexed when the
  // window holds no separator and p is inside the store.
  const int64_t end = static_cast<int64_t>(tokens_.size());
  for (int64_t p = std::max<int64_t>(begin, kAnchor); p < end; ++p) {
    const int32_t* w = tokens_.data() + p - kAnchor;
    bool ok = tokens_[p] >= 0;
    for (int i = 0; i < kAnchor && ok; ++i) ok = w[i] >= 0;
    if (!ok) continue;
    std::vector<int64_t>& at = index_[window_key(w)];
    if (static_cast<int>(at.size()) >= 2 * kPositionsPerKey)
      at.erase(at.begin(), at.begin() + kPositionsPerKey);  // amortised: keep the newest
    at.push_back(base_ + p);
  }
}

void RecentOutputs::drop_oldest_half() {
  // A memmove of the newer half; the index keeps its absolute positions (find skips the dropped
  // ones, sweep() erases keys left with none).
  const int64_t drop = std::max<int64_t>(static_cast<int64_t>(tokens_.size()) / 2, 1);
  tokens_.erase(tokens_.begin(), tokens_.begin() + drop);
  base_ += drop;
}

void RecentOutputs::sweep(size_t buckets) {
  const size_t count = index_.bucket_count();
  if (count == 0) return;
  std::vector<uint64_t> gone;
  for (size_t i = 0; i < buckets; ++i, ++sweep_bucket_) {
    const size_t b = sweep_bucket_ % count;
    for (auto it = index_.begin(b); it != index_.end(b); ++it)
      if (it->second.empty() || it->second.back() < base_ + kAnchor) gone.push_back(it->first);
  }
  for (uint64_t key : gone) index_.erase(key);  // erasing never rehashes
}

void RecentOutputs::observe(const int32_t* tokens, int64_t n) {
  if (n <= 0) return;
  std::unique_lock<std::shared_mutex> lock(mutex_);
  n = std::min<int64_t>(n, capacity_ - 1);
  while (!tokens_.empty() && static_cast<int64_t>(tokens_.size()) + n + 1 > capacity_) drop_oldest_half();
  const int64_t begin = static_cast<int64_t>(tokens_.size());
  for (int64_t i = 0; i < n; ++i) tokens_.push_back(tokens[i] < 0 ? -1 : tokens[i]);
  tokens_.push_back(-1);
  observed_ += static_cast<uint64_t>(n);
  index_from(begin);
  sweep(static_cast<size_t>(2 * n + 2));  // keys can only be added by n windows per call
}

void RecentOutputs::clear() {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  base_ += static_cast<int64_t>(tokens_.size());
  tokens_.clear();
  index_.clear();
  observed_ = 0;
}

std::vector<SuffixMatch> RecentOutputs::find(const int32_t* context, int64_t n, int min_len, int max_len,
                                             int k, int max_matches) const {
  std::vector<SuffixMatch> out;
  if (n < kAnchor || max_len < kAnchor || max_len < min_len || k < 1 || max_matches < 1) return out;
  const auto it = index_.find(window_key(context + n - kAnchor));
  if (it == index_.end()) return out;
  const int32_t* s = tokens_.data();
  const int64_t size = static_cast<int64_t>(tokens_.size());
  for (auto p = it->second.rbegin(); p != it->second.rend(); ++p) {
    const int64_t start = *p - base_;    // local position; the window before it must be held too
    if (start < kAnchor) break;          // older positions were dropped as well
    // true match length: compare backwards from the window (hash collisions fail here)
    int32_t len = 0;
    const int64_t limit = std::min<int64_t>({max_len, n, start});
    while (len < limit && s[start - 1 - len] >= 0 && s[start - 1 - len] == context[n - 1 - len]) ++len;
    if (len < std::max(min_len, kAnchor)) continue;
    int32_t cont = 0;
    while (cont < k && start + cont < size && s[start + cont] >= 0) ++cont;
    if (cont == 0) continue;
    out.push_back({start, len, cont});
  }
  std::sort(out.begin(), out.end(), ranks_before);
  if (static_cast<int>(out.size()) > max_matches) out.resize(static_cast<size_t>(max_matches));
  return out;
}

}  // namespace treespec::lookup
