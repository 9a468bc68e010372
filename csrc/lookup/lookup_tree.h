// Prompt lookup extended to trees: merge the continuations of several suffix matches.
//
// One match gives one guess of what follows (propose_chain). When the request's suffix occurred
// several times and the continuations disagree, a tree can hedge: the continuations of the best
// `max_matches` matches are merged into a trie under the root (the request's last token), each
// node weighted by how many continuations pass through it, and the heaviest nodes are drafted.
//
// Order and cut. Nodes are emitted by (weight desc, first_rank asc, depth asc) (continue_prob 1;
// see propose_tree for the general key, which also only falls along a path), where first_rank
// is the rank (0 = best, as find_suffix_matches orders them) of the best match through the node.
// Every match through a child also passes through its parent, so along any path weight never
// increases and first_rank never decreases; nodes with equal weight and equal first_rank lie on
// that one match's path, where depth orders parent before child. So the order is a total order in
// which every parent precedes its children: the tree for budget n is exactly the first n nodes of
// the tree for any budget N >= n (prefix-closed), and since weights only fall along a path the
// first n nodes are also the n heaviest ones. With a single match every weight is 1 and the order
// is the chain in depth order: propose_chain(k = max_depth) cut to the budget.
#pragma once

#include <cstdint>
#include <vector>

#include "lookup/recent_outputs.h"

namespace treespec::lookup {

// One emitted draft node.
struct TreeNode {
  int32_t token;
  int32_t parent;  // local index: 0 = root, i + 1 = the i-th emitted node (parent < own index)
  int32_t depth;   // 1 for children of the root
  int32_t weight;  // matches whose continuation passes through this node (>= 1)
};

// The merged continuations of the matches a lookup tree uses: node 0 is the root (weight =
// matches used; 0 when nothing matched, and then it is the only node), children are linked
// lists in reverse insertion order, `first_rank` is the rank of the best match through a node.
struct MatchNode {
  int32_t token;
  int32_t parent;
  int32_t depth;
  int32_t weight;
  int32_t first_rank;
  int32_t first_child = -1;
  int32_t next_sibling = -1;
};

// The matches of `propose_tree` (longest suffix length only, continuations cut to max_depth)
// merged into a trie. With `recent` (read-locked by the caller) and recent_max_n > 0, matches of
// the suffix (up to recent_max_n tokens) in recently served outputs compete too: the longest
// match length over both sources wins, the request's own matches rank first at equal length,
// and at most max_matches are merged. `match_len` (may be null) gets the merged matches' suffix
// length (0 when nothing matched).
std::vector<MatchNode> build_match_trie(const int32_t* tokens, int64_t n, int min_n, int max_n,
                                        int max_matches, int max_depth,
                                        const RecentOutputs* recent = nullptr, int recent_max_n = 0,
                                        int32_t* match_len = nullptr);

// Appends at most `budget` nodes of the lookup tree of tokens[0:n] to `out`, in the order above.
// Matches are find_suffix_matches(tokens, n, min_n, max_n, max_depth, max_matches), keeping only
// those whose matched suffix is as long as the best match's; each one
// contributes its continuation cut to max_depth tokens (never past n). Returns the number of
// matches used (the root's weight; 0 when nothing matched, and then nothing is appended).
// continue_prob in (0, 1]: the estimated chance that a copied continuation goes on one more token;
// nodes are ranked by log(weight / matches) + depth * log(continue_prob), so below 1 a shallow
// alternative branch outranks the deep tail of the majority path (1: by weight alone).
int propose_tree(const int32_t* tokens, int64_t n, int min_n, int max_n, int max_matches,
                 int max_depth, int64_t budget, std::vector<TreeNode>* out,
                 double continue_prob = 1.0);

}  // namespace treespec::lookup
