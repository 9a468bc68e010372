// Shared by the acceptance walks (greedy_walk.cpp, sampled_walk.cpp): the flat tree batch's
// checks and its child lists, so every walk accepts exactly the same trees.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace treespec::verify {

// first child / next sibling per global row, in node order, and the deepest node's depth.
struct ChildLists {
  std::vector<int64_t> first, next;
  int64_t max_depth = 0;
};

// Checks a flat tree batch (offsets [B+1] spanning [0, T], every request a root with parent
// -1, node i > 0 a parent in [0, i) in local indices) and builds its child lists. With
// vocab > 0 it also checks draft tokens are in [0, vocab) and sibling tokens are distinct; with
// depth != nullptr that depth agrees with the parents. Throws std::invalid_argument naming
// `who` (the walk) and the first bad row; callers that need the long form of the message run
// the Python validation (tree/batch.py: TreeBatch.check) on failure.
inline ChildLists check_tree_batch(const char* who, const int64_t* off, int64_t b,
                                   const int64_t* par, const int64_t* tok, int64_t t,
                                   int64_t vocab = 0, const int64_t* depth = nullptr) {
  const std::string name(who);
  if (b < 1) throw std::invalid_argument(name + ": need at least one request");
  if (off[0] != 0 || off[b] != t) throw std::invalid_argument(name + ": offsets must span [0, T]");
  ChildLists lists;
  lists.first.assign(t, -1);
  lists.next.assign(t, -1);
  std::vector<int64_t> level(depth != nullptr || vocab > 0 ? t : 0, 0);
  for (int64_t r = 0; r < b; ++r) {
    if (off[r + 1] <= off[r]) throw std::invalid_argument(name + ": every request needs a root");
    if (par[off[r]] != -1) throw std::invalid_argument(name + ": root parent must be -1");
    for (int64_t i = off[r] + 1; i < off[r + 1]; ++i) {
      if (par[i] < 0 || par[i] >= i - off[r])
        throw std::invalid_argument(name + ": bad parent at row " + std::to_string(i));
      if (vocab > 0 && (tok[i] < 0 || tok[i] >= vocab))
        throw std::invalid_argument(name + ": token outside the vocabulary at row " + std::to_string(i));
      if (!level.empty()) {
        level[i] = level[off[r] + par[i]] + 1;
        if (level[i] > lists.max_depth) lists.max_depth = level[i];
      }
    }
    for (int64_t i = off[r + 1] - 1; i > off[r]; --i) {
      const int64_t p = off[r] + par[i];
      lists.next[i] = lists.first[p];
      lists.first[p] = i;
    }
  }
  if (depth != nullptr)
    for (int64_t i = 0; i < t; ++i)
      if (depth[i] != level[i]) throw std::invalid_argument(name + ": depth disagrees with parents");
  if (vocab > 0)
    for (int64_t u = 0; u < t; ++u)
      for (int64_t c = lists.first[u]; c >= 0; c = lists.next[c])
        for (int64_t d = lists.next[c]; d >= 0; d = lists.next[d])
          if (tok[c] == tok[d])
            throw std::invalid_argument(name + ": two siblings share a token at row " + std::to_string(u));
  return lists;
}

// The child of `node` holding token x, or -1.
inline int64_t child_with_token(const ChildLists& lists, const int64_t* tok, int64_t node, int64_t x) {
  int64_t child = lists.first[node];
  while (child >= 0 && tok[child] != x) child = lists.next[child];
  return child;
}

// One request's descent from its root (global row `root`): pick(row) names the token emitted at
// each visited row; the walk follows the child holding it until none does or `width` tokens are
// out. Writes the tokens to em_row and the accepted local nodes to nd_row (both [width], -1
// filled by the caller); returns the number of tokens emitted.
template <class Pick>
int64_t walk_request(const ChildLists& lists, const int64_t* tok, int64_t root, int64_t width,
                     int64_t* em_row, int64_t* nd_row, Pick pick) {
  int64_t cur = root, level = 0;
  while (level < width) {
    const int64_t x = pick(cur);
    em_row[level] = x;
    const int64_t child = child_with_token(lists, tok, cur, x);
    if (child < 0 || level + 1 >= width) break;
    nd_row[level] = child - root;
    cur = child;
    ++level;
  }
  return level + 1;
}

}  // namespace treespec::verify
