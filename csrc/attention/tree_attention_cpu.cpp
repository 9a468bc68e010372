#include "attention/tree_attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace treespec::attention {

namespace {

// The hot loops, compiled for AVX-512 / AVX2 / baseline and picked at load time (the extension is
// built for generic x86-64, so without clones these loops would use SSE2 only).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TREESPEC_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TREESPEC_CLONES
#endif

// acc[s] += x * col[s], s < n (one K column of a column-major block).
TREESPEC_CLONES void axpy(float* acc, float x, const float* col, int n) {
  for (int s = 0; s < n; ++s) acc[s] += x * col[s];
}

TREESPEC_CLONES float dot(const float* a, const float* b, int n) {
  float sum = 0.0f;
  for (int d = 0; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

struct Request {
  const TreeAttentionArgs& a;
  int64_t r, prefix, tree, kv_len, row0, rows;
  int group;

  const float* key_block(int64_t logical_block, int h) const {
    const int64_t b = a.block_table[r * a.bt_stride + logical_block];
    if (b < 0 || b >= a.num_blocks)
      throw std::invalid_argument("tree attention: block id " + std::to_string(b) + " of request " +
                                  std::to_string(r) + " is outside the cache");
    return a.kv_cache + ((b * a.num_kv_heads + h) * 2 * static_cast<int64_t>(a.block_size)) * a.head_size;
  }
  bool visible(int64_t row, int64_t pos) const {   // row: flat row; pos: logical position
    if (pos < prefix) return true;
    const int64_t j = pos - prefix;
    return (static_cast<uint64_t>(a.anc_mask[row * a.words + (j >> 6)]) >> (j & 63)) & 1u;
  }
};

void one_request(const Request& q, std::vector<float>& scores, std::vector<float>& acc) {
  const TreeAttentionArgs& a = q.a;
  const int D = a.head_size, bs = a.block_size, G = q.group;
  const int64_t L = q.kv_len, nq = q.rows * G;
  const int64_t nblk = (L + bs - 1) / bs;
  scores.assign(static_cast<size_t>(nq * L), 0.0f);
  acc.assign(static_cast<size_t>(nq * D), 0.0f);
  for (int h = 0; h < a.num_kv_heads; ++h) {
    std::fill(scores.begin(), scores.end(), 0.0f);
    std::fill(acc.begin(), acc.end(), 0.0f);
    // Q K^T, block by block: each K element read once per query row of this KV head.
    for (int64_t lb = 0; lb < nblk; ++lb) {
      const float* kb = q.key_block(lb, h);
      const int64_t s0 = lb * bs;
      const int n = static_cast<int>(std::min<int64_t>(bs, L - s0));
      for (int64_t i = 0; i < nq; ++i) {
        const float* qi = a.query + ((q.row0 + i / G) * a.num_q_heads + h * G + i % G) * D;
        float* si = scores.data() + i * L + s0;
        if (a.k_column_major) {
          for (int d = 0; d < D; ++d) axpy(si, qi[d], kb + static_cast<int64_t>(d) * bs, n);
        } else {
          for (int s = 0; s < n; ++s) si[s] = dot(qi, kb + static_cast<int64_t>(s) * D, D);
        }
      }
    }
    // Scale, soft cap, mask, softmax per query row.
    for (int64_t i = 0; i < nq; ++i) {
      const int64_t row = q.row0 + i / G;
      float* si = scores.data() + i * L;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t s = 0; s < L; ++s) {
        float x = si[s] * a.scale;
        if (a.soft_cap > 0.0f) x = a.soft_cap * std::tanh(x / a.soft_cap);
        x = q.visible(row, s) ? x : -std::numeric_limits<float>::infinity();
        si[s] = x;
        mx = std::max(mx, x);
      }
      float sum = 0.0f;
      for (int64_t s = 0; s < L; ++s) {
        const float e = si[s] == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(si[s] - mx);
        si[s] = e;
        sum += e;
      }
      const float inv = 1.0f / sum;
      for (int64_t s = 0; s < L; ++s) si[s] *= inv;
    }
    // P V, block by block (V rows are contiguous).
    for (int64_t lb = 0; lb < nblk; ++lb) {
      const float* vb = q.key_block(lb, h) + static_cast<int64_t>(bs) * D;
      const int64_t s0 = lb * bs;
      const int n = static_cast<int>(std::min<int64_t>(bs, L - s0));
      for (int64_t i = 0; i < nq; ++i) {
        const float* pi = scores.data() + i * L + s0;
        float* oi = acc.data() + i * D;
        for (int s = 0; s < n; ++s)
          if (pi[s] != 0.0f) axpy(oi, pi[s], vb + static_cast<int64_t>(s) * D, D);
      }
    }
    for (int64_t i = 0; i < nq; ++i) {
      float* dst = a.out + ((q.row0 + i / G) * a.num_q_heads + h * G + i % G) * D;
      std::copy(acc.data() + i * D, acc.data() + (i + 1) * D, dst);
    }
  }
}

}  // namespace

void tree_attention_cpu(const TreeAttentionArgs& a) {
  if (a.num_q_heads <= 0 || a.num_kv_heads <= 0 || a.num_q_heads % a.num_kv_heads)
    throw std::invalid_argument("tree attention: query heads must be a positive multiple of KV heads");
  if (a.head_size <= 0 || a.block_size <= 0) throw std::invalid_argument("tree attention: bad head or block size");
  if (a.offsets[0] != 0 || a.offsets[a.num_reqs] != a.num_rows)
    throw std::invalid_argument("tree attention: offsets must run from 0 to the number of rows");
  std::vector<float> scores, acc;
  for (int64_t r = 0; r < a.num_reqs; ++r) {
    const int64_t rows = a.offsets[r + 1] - a.offsets[r];
    if (rows < 0) throw std::invalid_argument("tree attention: offsets must not decrease");
    if (rows == 0) continue;
    if (a.tree_sizes[r] > 64LL * a.words || a.tree_sizes[r] < 1 || a.prefix_lens[r] < 0)
      throw std::invalid_argument("tree attention: request " + std::to_string(r) +
                                  " has a tree size outside its mask words or a negative prefix");
    const int64_t kv_len = a.prefix_lens[r] + a.tree_sizes[r];
    if ((kv_len + a.block_size - 1) / a.block_size > a.bt_stride)
      throw std::invalid_argument("tree attention: the block table is too narrow for request " +
                                  std::to_string(r));
    one_request(Request{a, r, a.prefix_lens[r], a.tree_sizes[r], kv_len, a.offsets[r], rows,
                        a.num_q_heads / a.num_kv_heads},
                scores, acc);
  }
}

}  // namespace treespec::attention
