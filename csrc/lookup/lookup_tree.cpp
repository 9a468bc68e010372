#include "lookup/lookup_tree.h"

#include <algorithm>
#include <cmath>

#include "lookup/prompt_lookup.h"

namespace treespec::lookup {

namespace {

int32_t add_child(std::vector<MatchNode>* trie, int32_t parent, int32_t token, int32_t rank) {
  auto& t = *trie;
  const int32_t id = static_cast<int32_t>(t.size());
  t.push_back({token, parent, t[parent].depth + 1, 1, rank, -1, t[parent].first_child});
  t[parent].first_child = id;
  return id;
}

// Walks (and extends) the trie along one continuation, counting the match on every node.
void insert(std::vector<MatchNode>* trie, const int32_t* cont, int32_t len, int32_t rank) {
  auto& t = *trie;
  int32_t cur = 0;
  ++t[0].weight;
  int32_t i = 0;
  for (; i < len; ++i) {
    int32_t c = t[cur].first_child;
    while (c >= 0 && t[c].token != cont[i]) c = t[c].next_sibling;
    if (c < 0) break;
    ++t[c].weight;
    cur = c;
  }
  for (; i < len; ++i) cur = add_child(trie, cur, cont[i], rank);  // fresh nodes: no search
}

}  // namespace

std::vector<MatchNode> build_match_trie(const int32_t* tokens, int64_t n, int min_n, int max_n,
                                        int max_matches, int max_depth, const RecentOutputs* recent,
                                        int recent_max_n, int32_t* match_len) {
  if (match_len != nullptr) *match_len = 0;
  std::vector<MatchNode> trie;
  trie.push_back({-1, -1, 0, 0, 0, -1, -1});
  if (max_depth < 1 || max_matches < 1) return trie;
  auto own = find_suffix_matches(tokens, n, min_n, max_n, max_depth, max_matches);
  std::vector<SuffixMatch> others;
  if (recent != nullptr && recent_max_n > 0)
    others = recent->find(tokens, n, min_n, recent_max_n, max_depth, max_matches);
  if (own.empty() && others.empty()) return trie;
  // Only matches of the longest suffix length: shorter suffix matches are weaker evidence, and
  // counted equally they would outrank the best continuation (measured: trees from all 8 best
  // matches verified fewer tokens per step than the best match's chain on the code-LM fixture).
  const int32_t best_len = std::max(own.empty() ? 0 : own.front().match_len,
                                    others.empty() ? 0 : others.front().match_len);
  if (match_len != nullptr) *match_len = best_len;
  const auto shorter = [best_len](const SuffixMatch& m) { return m.match_len != best_len; };
  own.erase(std::remove_if(own.begin(), own.end(), shorter), own.end());
  others.erase(std::remove_if(others.begin(), others.end(), shorter), others.end());
  // own has at most max_matches (find_suffix_matches); the recent ones fill what is left
  others.resize(std::min(others.size(), static_cast<size_t>(max_matches) - own.size()));
  size_t nodes = 1;
  for (const auto* ms : {&own, &others})
    for (const SuffixMatch& m : *ms) nodes += static_cast<size_t>(m.continuation_len);
  trie.reserve(nodes);
  int32_t rank = 0;
  for (const SuffixMatch& m : own) insert(&trie, tokens + m.continuation_start, m.continuation_len, rank++);
  for (const SuffixMatch& m : others)
    insert(&trie, recent->data() + m.continuation_start, m.continuation_len, rank++);
  return trie;
}

int propose_tree(const int32_t* tokens, int64_t n, int min_n, int max_n, int max_matches,
                 int max_depth, int64_t budget, std::vector<TreeNode>* out, double continue_prob) {
  if (budget <= 0 || max_depth < 1) return 0;
  const std::vector<MatchNode> trie = build_match_trie(tokens, n, min_n, max_n, max_matches, max_depth);
  if (trie[0].weight == 0) return 0;

  // Emission order (see the header): estimated path probability desc, i.e. log(weight / matches)
  // + depth * log(continue_prob), then first_rank asc, then creation order (along one match's
  // path, depth order). continue_prob = 1 orders by weight alone.
  std::vector<int32_t> order(trie.size() - 1);
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i + 1);
  const double log_continue = std::log(continue_prob);
  const double total = trie[0].weight;
  std::vector<double> key(trie.size());
  for (size_t i = 1; i < trie.size(); ++i)
    key[i] = std::log(trie[i].weight / total) + trie[i].depth * log_continue;
  const auto before = [&trie, &key](int32_t a, int32_t b) {
    if (key[a] != key[b]) return key[a] > key[b];
    if (trie[a].first_rank != trie[b].first_rank) return trie[a].first_rank < trie[b].first_rank;
    return a < b;
  };
  const size_t take = static_cast<size_t>(std::min<int64_t>(budget, order.size()));
  std::partial_sort(order.begin(), order.begin() + take, order.end(), before);

  std::vector<int32_t> local(trie.size(), -1);
  local[0] = 0;
  for (size_t i = 0; i < take; ++i) {
    const MatchNode& node = trie[order[i]];
    local[order[i]] = static_cast<int32_t>(i + 1);
    out->push_back({node.token, local[node.parent], node.depth, node.weight});
  }
  return trie[0].weight;
}

}  // namespace treespec::lookup
