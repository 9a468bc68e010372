#include "tree/trie_ngram.h"

#include <cmath>
#include <stdexcept>
#include <utility>
#include <vector>

namespace treespec::tree {

TrieNgram::TrieNgram(std::shared_ptr<const ngram::TrieFile> file,
                     std::shared_ptr<const ngram::OnlineCounts> online, double floor)
    : file_(std::move(file)), online_(std::move(online)), floor_(floor) {
  if (!file_) throw std::invalid_argument("TrieNgram needs a trie");
}

void TrieNgram::logprobs(const int32_t* ctx, int ctx_len, const int32_t* cand, int n, double* out) const {
  if (n <= 0) return;
  // cursor() keeps the last order-1 tokens itself; the builders pass at most max_context().
  const ngram::Cursor c = file_->cursor(ctx, ctx_len);
  {
    ngram::OnlineCounts::ReadLock lock;
    if (online_) lock = online_->read_lock();
    file_->prob(c, cand, n, floor_, online_.get(), out, nullptr);  // probabilities, in place
  }
  for (int i = 0; i < n; ++i) out[i] = std::log(out[i]);
}

}  // namespace treespec::tree
