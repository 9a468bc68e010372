// Plain C++ entry points of the CUDA kernels in this directory (raw device pointers + stream).
//
// Kept free of torch headers so that each .cu file compiles with nothing but nvcc (the compile
// check in tests/test_cuda_compile.py); bindings.cpp adapts them to torch ops.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace treespec::cuda {

// Greedy tree acceptance, one block per request (same rule as csrc/verify/greedy_walk.cpp).
// offsets [B+1], tokens / parents (local, -1 at roots) / target (argmax per row) [T], all int64.
// Outputs int64: emitted [B, width], nodes [B, width] (local accepted nodes without the root),
// both -1 padded, num_emitted [B].
cudaError_t launch_greedy_tree_accept(const int64_t* offsets, const int64_t* tokens,
                                      const int64_t* parents, const int64_t* target,
                                      int64_t* emitted, int64_t* nodes, int64_t* num_emitted,
                                      int64_t num_requests, int width, cudaStream_t stream);

// Geometry shared by every K or V tensor in a KV compaction launch (bytes).
struct KVGeometry {
  int64_t block_size;
  int64_t stride_block;  // bytes between physical blocks
  int64_t stride_token;  // bytes between slots of a block
  int64_t stride_head;   // bytes between KV heads of a slot
  int64_t num_heads;
  int64_t row_bytes;     // head_dim * element size (contiguous)
  int64_t base_align;    // largest power of two dividing every tensor's base address
};

// Copy slot src[r, j] -> dst[r, j] (int64 [B, width], row stride stride_move, -1 = no move,
// ascending destinations per request) in every tensor whose base address is in ptrs
// (int64 [num_tensors], device memory).
cudaError_t launch_kv_compact(const int64_t* ptrs, int64_t num_tensors, const int64_t* src,
                              const int64_t* dst, int64_t num_requests, int64_t width,
                              int64_t stride_move, const KVGeometry& geo, cudaStream_t stream);

// Largest copy unit (16, 8, 4, 2 or 1 bytes) dividing the row size, every stride and
// base_align.
int kv_word_bytes(const KVGeometry& geo);

}  // namespace treespec::cuda
