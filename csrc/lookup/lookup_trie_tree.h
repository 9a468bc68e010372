// Lookup-trie trees: prompt-lookup continuations mixed with corpus n-gram trie continuations.
//
// Prompt lookup is precise where the request repeats itself and silent elsewhere; a corpus
// n-gram trie always has a guess but a weak one (order-3 context). One best-first tree over their
// mixture drafts the lookup continuation where there is one and hedges with the trie's
// alternatives where the lookup is absent or likely to stop.
//
// Children of a node v (path p from the root, depth < max_depth):
//   q_L(c) = weight(child c of v's match-trie node) / weight(v's match-trie node), from the
//            merged continuations of the request's longest-suffix matches (build_match_trie);
//            v has a match-trie node while p follows some match continuation;
//   q_T(c) = the n-gram trie's probability of c after (context + p), for its top-k tokens whose
//            probability came from a suffix of at least min_context tokens;
//   P(c)   = lambda * q_L(c) + (1 - lambda) * q_T(c), lambda = lookup_weight when v has lookup
//            children, else 0 (so without matches this is the plain trie tree).
// Children are ranked (P desc, token asc); a node's score is the sum of log P along its path.
// Best-first with lazy push pops nodes by (score desc, depth asc, sibling-position path asc)
// and emits them in pop order (parents first; budget n gives the first n nodes of any larger
// budget). chain = the greedy spine: the best child of each node, depth by depth.
// depth_per_match > 0 caps the depth at ceil(depth_per_match * L), L = the merged matches' suffix
// length, or the trie's context length (order - 1) where nothing matched: a continuation is only
// as trustworthy as the context that predicts it (SuffixDecoding's match-length rule), and a
// count of one in the online layer would otherwise chain to max_depth at probability 1.
// min_path_prob > 0 also stops at the first node whose path probability exp(score) is below it
// (scores only fall in pop order, so the result is still a prefix of the unfloored order): a
// confident match drafts deep, a guess drafts little, and no verify row is spent on a path the
// drafter itself rates unlikely.
#pragma once

#include <cstdint>
#include <vector>

#include "lookup/recent_outputs.h"
#include "ngram/online.h"
#include "ngram/topk_memo.h"
#include "ngram/trie.h"

namespace treespec::lookup {

struct LookupTrieParams {
  int min_n = 1, max_n = 4, max_matches = 8;  // prompt lookup (max_matches 0: trie only)
  int recent_max_n = 0;   // longest suffix matched in recent outputs (0: not searched)
  double depth_per_match = 0.0;  // depth cap per matched suffix token (0: max_depth only)
  int max_depth = 8;
  int k = 4;              // trie continuations per node
  int min_context = 1;    // trie tokens need a matched context of at least this many tokens
  double lookup_weight = 0.8;
  double min_path_prob = 0.0;  // 0 = fill the budget
  bool chain = false;
};

struct MixedNode {
  int32_t token;
  int32_t parent;  // local index: 0 = root, i + 1 = the i-th emitted node
  int32_t depth;
  double logprob;  // log P of this node given its parent
  double score;    // sum of logprob along the path
  int8_t source;   // kSourceMatch: the token continues a suffix match; kSourceTrie: the trie's guess alone
};

// What rated a node (DraftTree.source): a match continuation and a trie guess rated alike are
// not accepted alike (replayed on SmolLM2 chat at 8 requests, trie guesses rated 0.95-1 were
// accepted 4% of the time, match continuations rated 0.80-0.85 64%:
// benchmarks/results/replay_tau_sources_c8_smollm2-135m.json), so the engine calibrates each apart.
constexpr int8_t kSourceMatch = 0;
constexpr int8_t kSourceTrie = 1;

// Appends at most `budget` nodes of the tree of tokens[0:n] (root = tokens[n-1]) to `out`.
// `online` (may be null) must be read-locked by the caller for the duration of the call.
// `recent` (may be null) must be read-locked by the caller too.
// `memo` (may be null; unused with an online layer) answers repeated trie contexts; the caller
// serialises its use. The nodes are the same with or without it.
void propose_lookup_trie_tree(const int32_t* tokens, int64_t n, int64_t budget,
                              const LookupTrieParams& params, const ngram::TrieFile& trie,
                              const ngram::OnlineCounts* online, std::vector<MixedNode>* out,
                              ngram::TopkMemo* memo = nullptr, const RecentOutputs* recent = nullptr);

}  // namespace treespec::lookup
