#include "lookup/prompt_lookup.h"

#include <algorithm>

namespace treespec::lookup {

bool ranks_before(const SuffixMatch& a, const SuffixMatch& b) {
  if (a.match_len != b.match_len) return a.match_len > b.match_len;
  if (a.continuation_len != b.continuation_len) return a.continuation_len > b.continuation_len;
  return a.continuation_start > b.continuation_start;
}

std::vector<SuffixMatch> find_suffix_matches(const int32_t* tokens, int64_t n, int min_n, int max_n,
                                             int k, int max_matches) {
  std::vector<SuffixMatch> out;
  if (n < 2 || min_n < 1 || max_n < min_n || k < 1 || max_matches < 1) return out;
  const int32_t last = tokens[n - 1];
  // End position j of an earlier occurrence: tokens[j - l + 1 .. j] == tokens[n - l .. n - 1].
  // j <= n - 2 so that at least one continuation token exists. Most candidates fail on the
  // first comparison, so this is O(n) in practice and O(n * max_n) at worst.
  for (int64_t j = n - 2; j >= 0; --j) {
    if (tokens[j] != last) continue;
    int32_t len = 1;
    const int64_t limit = std::min<int64_t>(max_n, j + 1);
    while (len < limit && tokens[j - len] == tokens[n - 1 - len]) ++len;
    if (len < min_n) continue;
    SuffixMatch m;
    m.continuation_start = j + 1;
    m.match_len = len;
    m.continuation_len = static_cast<int32_t>(std::min<int64_t>(k, n - (j + 1)));
    if (static_cast<int>(out.size()) < max_matches) {
      out.push_back(m);
      std::push_heap(out.begin(), out.end(), ranks_before);  // heap front = worst kept
    } else if (ranks_before(m, out.front())) {
      std::pop_heap(out.begin(), out.end(), ranks_before);
      out.back() = m;
      std::push_heap(out.begin(), out.end(), ranks_before);
    }
  }
  std::sort(out.begin(), out.end(), ranks_before);
  return out;
}

int propose_chain(const int32_t* tokens, int64_t n, int min_n, int max_n, int k, int32_t* out) {
  const auto matches = find_suffix_matches(tokens, n, min_n, max_n, k, 1);
  if (matches.empty()) return 0;
  const SuffixMatch& best = matches.front();
  std::copy(tokens + best.continuation_start,
            tokens + best.continuation_start + best.continuation_len, out);
  return best.continuation_len;
}

}  // namespace treespec::lookup
