// TrieNgram: the frozen n-gram trie (csrc/ngram/) as an NgramScorer for the C++ tree builders.
//
// Same rule as vllm_treespec/drafters/ngram_trie.py TrieSignal: log P(candidate | context) with
// the trie's longest-suffix backoff (TrieFile::prob over the last order-1 context tokens), and
// log(floor) for candidates that no suffix has seen. The log is the C library's std::log, as
// everywhere else in the tree code (see vllm_treespec/tree/scorers.py smooth_log).
//
// The scorer holds the mapping (shared_ptr), so it stays valid when the Python trie object goes
// away, and the online layer that was active when it was made (a snapshot of the pointer: a
// later enable_online() on the trie does not reach an existing scorer; make a new one).
#pragma once

#include <memory>

#include "ngram/online.h"
#include "ngram/trie.h"
#include "tree/ngram_scorer.h"

namespace treespec::tree {

class TrieNgram final : public NgramScorer {
 public:
  TrieNgram(std::shared_ptr<const ngram::TrieFile> file, std::shared_ptr<const ngram::OnlineCounts> online,
            double floor);

  int max_context() const override { return file_->order() - 1; }
  // Safe for concurrent calls: the mapping is immutable and the online layer is read under its
  // reader lock.
  void logprobs(const int32_t* ctx, int ctx_len, const int32_t* cand, int n, double* out) const override;

  double floor_value() const { return floor_; }
  const ngram::TrieFile& file() const { return *file_; }

 private:
  std::shared_ptr<const ngram::TrieFile> file_;
  std::shared_ptr<const ngram::OnlineCounts> online_;
  double floor_;
};

}  // namespace treespec::tree
