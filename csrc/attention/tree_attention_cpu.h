// Tree attention over vLLM's CPU paged KV cache, float32, straight from the cache layout.
//
// The torch path (vllm_treespec/attention/tree_attention_cpu.py) gathers every request's blocks
// into padded buffers, builds an additive mask and runs one SDPA: ~40 small ops per layer, which
// cost more than the arithmetic at verification sizes (NOTES.md there). This kernel reads K and V
// in place: scores over the prefix, scores over the row's ancestors only (bits of its ancestor
// words), softmax, then the weighted V sum. Same inputs and semantics as `tree_attention`
// (rows of request r at offsets[r]..offsets[r+1]-1, identified by their ancestor words; tree
// node j's K/V at logical position prefix_lens[r] + j; GQA head h reads KV head h / (Hq/Hkv)).
//
// Layouts: the layer cache is [num_blocks, Hkv, block_size, 2 * D] float32; per (block, head)
// the first block_size * D floats are K, the next V. K is column-major [D, block_size] for vLLM's
// vec / vec16 ISAs and row-major [block_size, D] for token_major; V is row-major in all three.
// Other layouts and dtypes stay on the torch path.
#pragma once

#include <cstdint>

namespace treespec::attention {

struct TreeAttentionArgs {
  const float* query = nullptr;   // [T, Hq, D]
  int64_t num_rows = 0;           // T
  int num_q_heads = 0, num_kv_heads = 0, head_size = 0;
  const float* kv_cache = nullptr;  // [num_blocks, Hkv, block_size, 2 * D]
  int64_t num_blocks = 0;
  int block_size = 0;
  bool k_column_major = true;
  const int32_t* block_table = nullptr;  // [R, bt_stride]
  int64_t bt_stride = 0;
  int64_t num_reqs = 0;                  // R
  const int64_t* prefix_lens = nullptr;  // [R]
  const int64_t* tree_sizes = nullptr;   // [R]
  const int64_t* offsets = nullptr;      // [R + 1]
  const int64_t* anc_mask = nullptr;     // [T, words]
  int words = 0;
  float scale = 1.0f;
  float soft_cap = 0.0f;                 // 0 = none
  float* out = nullptr;                  // [T, Hq, D]
};

// Throws std::invalid_argument on inconsistent sizes or block ids outside the cache.
void tree_attention_cpu(const TreeAttentionArgs& a);

}  // namespace treespec::attention
