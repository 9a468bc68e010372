#include "lookup/lookup_trie_tree.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>

#include "lookup/lookup_tree.h"
#include "ngram/topk_memo.h"

namespace treespec::lookup {

namespace {

struct Child {
  int32_t token;
  double p;
  int32_t match;  // match-trie node of the child, -1 if none
};

struct Search {
  const LookupTrieParams& prm;
  const ngram::TrieFile& trie;
  const ngram::OnlineCounts* online;
  ngram::TopkMemo* memo;  // null: every topk is computed
  int32_t match_len = 0;  // set by build_match_trie (declared before `matches`: initialised first)
  std::vector<MatchNode> matches;
  int32_t depth_cap;
  // Candidate-tree nodes (0 = root).
  std::vector<int32_t> parent, depth, pos, token, match, emitted;
  std::vector<double> logp, score;
  std::vector<ngram::Cursor> context;  // token-only cursors (TrieFile::token_cursor): nodes resolved on demand
  std::vector<std::vector<int32_t>> pospath;
  std::vector<std::vector<Child>> kids;  // sorted children, computed on first use
  std::vector<bool> has_kids;

  Search(const int32_t* t, int64_t n, const LookupTrieParams& p, const ngram::TrieFile& tr,
         const ngram::OnlineCounts* on, ngram::TopkMemo* mm, const RecentOutputs* recent)
      : prm(p), trie(tr), online(on), memo(on ? nullptr : mm),
        matches(build_match_trie(t, n, p.min_n, p.max_n, p.max_matches, p.max_depth, recent, p.recent_max_n,
                                 &match_len)),
        depth_cap(p.max_depth) {
    if (p.depth_per_match > 0.0) {
      const int32_t context = match_len > 0 ? match_len : std::max(trie.order() - 1, 1);
      const double cap = std::ceil(p.depth_per_match * context);
      depth_cap = cap < p.max_depth ? std::max(1, static_cast<int32_t>(cap)) : p.max_depth;
    }
    const int64_t m = std::min<int64_t>(std::max(trie.order() - 1, 1), n);
    add(-1, 0, 0, t[n - 1], matches[0].weight > 0 ? 0 : -1, trie.token_cursor(t + n - m, m), 0.0, 0.0, {});
  }

  int32_t add(int32_t par, int32_t d, int32_t ps, int32_t tok, int32_t mt, const ngram::Cursor& c,
              double lp, double s, std::vector<int32_t> path) {
    parent.push_back(par), depth.push_back(d), pos.push_back(ps), token.push_back(tok);
    match.push_back(mt), emitted.push_back(-1), logp.push_back(lp), score.push_back(s);
    context.push_back(c), pospath.push_back(std::move(path));
    kids.emplace_back(), has_kids.push_back(false);
    return static_cast<int32_t>(parent.size() - 1);
  }

  const std::vector<Child>& children(int32_t v) {
    if (has_kids[v]) return kids[v];
    has_kids[v] = true;
    std::vector<Child> out;
    if (depth[v] >= depth_cap) return kids[v];
    const int32_t mv = match[v];
    const bool lookup = mv >= 0 && matches[mv].first_child >= 0;
    const double lambda = lookup ? prm.lookup_weight : 0.0;
    if (lookup) {
      const double w = matches[mv].weight;
      for (int32_t c = matches[mv].first_child; c >= 0; c = matches[c].next_sibling)
        out.push_back({matches[c].token, 0.0 + lambda * (matches[c].weight / w), c});
    }
    // Each top-k entry carries the suffix length that scored it (what prob() would report as
    // its order), so min_context needs no second lookup: after a forward pass the trie is
    // cache-cold and every lookup is a string of misses.
    std::vector<ngram::Scored> fresh;
    const std::vector<ngram::Scored>& top =
        memo ? memo->topk(trie, context[v], prm.k)
             : (fresh = trie.topk(trie.resolve(context[v]), prm.k, online));
    for (const ngram::Scored& s : top) {
      if (prm.min_context > 0 && s.order < prm.min_context) continue;
      const double q = (1.0 - lambda) * s.prob;
      auto it = std::find_if(out.begin(), out.end(), [&](const Child& c) { return c.token == s.token; });
      if (it != out.end()) it->p += q;
      else out.push_back({s.token, 0.0 + q, -1});
    }
    out.erase(std::remove_if(out.begin(), out.end(), [](const Child& c) { return !(c.p > 0.0); }), out.end());
    std::sort(out.begin(), out.end(), [](const Child& a, const Child& b) {
      return a.p != b.p ? a.p > b.p : a.token < b.token;
    });
    kids[v] = std::move(out);
    return kids[v];
  }

  // The i-th child of v as a candidate-tree node.
  int32_t make_child(int32_t v, int32_t i) {
    const Child c = children(v)[i];
    const double lp = std::log(c.p);
    std::vector<int32_t> path = pospath[v];
    path.push_back(i);
    return add(v, depth[v] + 1, i, c.token, c.match, trie.advance_tokens(context[v], c.token),
               lp, score[v] + lp, std::move(path));
  }
};

}  // namespace

void propose_lookup_trie_tree(const int32_t* tokens, int64_t n, int64_t budget,
                              const LookupTrieParams& params, const ngram::TrieFile& trie,
                              const ngram::OnlineCounts* online, std::vector<MixedNode>* out,
                              ngram::TopkMemo* memo, const RecentOutputs* recent) {
  if (budget <= 0 || n <= 0 || params.max_depth < 1) return;
  Search s(tokens, n, params, trie, online, memo, recent);
  s.emitted[0] = 0;
  const size_t start = out->size();
  const auto emitted_count = [&]() { return static_cast<int64_t>(out->size() - start); };
  const auto emit = [&](int32_t v) {
    s.emitted[v] = static_cast<int32_t>(emitted_count()) + 1;
    out->push_back({s.token[v], s.emitted[s.parent[v]], s.depth[v], s.logp[v], s.score[v],
                    s.match[v] >= 0 ? kSourceMatch : kSourceTrie});
  };
  // Scores are sums of log P <= 0; a floor of 0 admits every node (log 0 = -inf).
  const double floor = params.min_path_prob > 0.0 ? std::log(params.min_path_prob)
                                                  : -std::numeric_limits<double>::infinity();
  if (params.chain) {
    for (int32_t v = 0; emitted_count() < budget && !s.children(v).empty();) {
      v = s.make_child(v, 0);
      if (s.score[v] < floor) break;
      emit(v);
    }
    return;
  }
  // Pop order: score desc, depth asc, sibling-position path asc.
  const auto later = [&s](int32_t a, int32_t b) {
    if (s.score[a] != s.score[b]) return s.score[a] < s.score[b];
    if (s.depth[a] != s.depth[b]) return s.depth[a] > s.depth[b];
    return s.pospath[a] > s.pospath[b];
  };
  std::priority_queue<int32_t, std::vector<int32_t>, decltype(later)> heap(later);
  if (!s.children(0).empty()) heap.push(s.make_child(0, 0));
  while (emitted_count() < budget && !heap.empty()) {
    const int32_t v = heap.top();
    if (s.score[v] < floor) break;  // every later pop scores lower still
    heap.pop();
    emit(v);
    if (!s.children(v).empty()) heap.push(s.make_child(v, 0));
    const int32_t p = s.parent[v];
    if (s.pos[v] + 1 < static_cast<int32_t>(s.children(p).size())) heap.push(s.make_child(p, s.pos[v] + 1));
  }
}

}  // namespace treespec::lookup
