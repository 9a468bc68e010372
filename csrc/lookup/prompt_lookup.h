// Prompt lookup: find earlier occurrences of a request's own suffix and propose what followed.
//
// The drafter behind `configs/drafters/prompt-lookup.yaml`. Pure C++ over a raw token array so the
// batched entry point can run without the GIL straight on vLLM's token_ids_cpu buffer.
#pragma once

#include <cstdint>
#include <vector>

namespace treespec::lookup {

struct SuffixMatch {
  int64_t continuation_start;  // index of the first token after the matched n-gram
  int32_t match_len;           // length of the matched suffix n-gram (min_n..max_n)
  int32_t continuation_len;    // tokens available after the match, capped at k
};

// Match order, best first: longer match, then longer available continuation, then more recent.
bool ranks_before(const SuffixMatch& a, const SuffixMatch& b);

// All earlier end positions where the last `match_len >= min_n` tokens of tokens[0:n] occur
// again (match capped at max_n), best first: longer match, then longer available continuation
// (capped at k), then more recent. At most `max_matches` results; only positions with at least
// one continuation token are returned.
std::vector<SuffixMatch> find_suffix_matches(const int32_t* tokens, int64_t n, int min_n, int max_n,
                                             int k, int max_matches);

// Writes the continuation of the best match (at most k tokens) to `out`; returns its length
// (0 when no suffix of length >= min_n occurs earlier).
int propose_chain(const int32_t* tokens, int64_t n, int min_n, int max_n, int k, int32_t* out);

}  // namespace treespec::lookup
