// KV compaction after tree acceptance: every layer's K and V in one launch, in place.
//
// Grid (request, tensor, column chunk); a thread owns one copy word at a fixed column of the
// slot row and applies the request's moves to it in ascending destination order. Aliasing is
// per column, so the thread's own program order is all the ordering needed: move j may
// overwrite the source of an earlier move (already read by this thread), never that of a later
// one (later sources i_k >= k > j are positions no earlier move writes). Requests own disjoint
// slots and columns are independent, so no two threads touch the same word. Dtype-blind: words
// of 16/8/4/2/1 bytes, whichever the geometry allows (fp8 caches included).
#include "launchers.h"

namespace treespec::cuda {
namespace {

constexpr int kThreads = 256;

template <typename Word>
__global__ void kv_compact_kernel(const int64_t* __restrict__ ptrs,
                                  const int64_t* __restrict__ src,
                                  const int64_t* __restrict__ dst, int64_t width,
                                  int64_t stride_move, int64_t block_size, int64_t stride_block,
                                  int64_t stride_token, int64_t stride_head, int64_t row_words,
                                  int64_t num_cols) {
  const int64_t c = static_cast<int64_t>(blockIdx.z) * blockDim.x + threadIdx.x;
  if (c >= num_cols) return;
  // Not __restrict__: sources and destinations alias by design; order must be kept.
  Word* base = reinterpret_cast<Word*>(ptrs[blockIdx.y]);
  const int64_t col = (c / row_words) * stride_head + c % row_words;
  const int64_t* s_row = src + static_cast<int64_t>(blockIdx.x) * stride_move;
  const int64_t* d_row = dst + static_cast<int64_t>(blockIdx.x) * stride_move;
  for (int64_t j = 0; j < width; ++j) {
    const int64_t s = s_row[j], d = d_row[j];
    if (s < 0 || d < 0 || s == d) continue;
    base[(d / block_size) * stride_block + (d % block_size) * stride_token + col] =
        base[(s / block_size) * stride_block + (s % block_size) * stride_token + col];
  }
}

template <typename Word>
cudaError_t launch(const int64_t* ptrs, int64_t num_tensors, const int64_t* src,
                   const int64_t* dst, int64_t num_requests, int64_t width, int64_t stride_move,
                   const KVGeometry& geo, cudaStream_t stream) {
  const int64_t w = sizeof(Word);
  const int64_t row_words = geo.row_bytes / w;
  const int64_t num_cols = geo.num_heads * row_words;
  const int64_t chunks = (num_cols + kThreads - 1) / kThreads;
  if (num_requests > INT32_MAX || num_tensors > 65535 || chunks > 65535)
    return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(num_requests), static_cast<unsigned>(num_tensors),
                  static_cast<unsigned>(chunks));
  kv_compact_kernel<Word><<<grid, kThreads, 0, stream>>>(
      ptrs, src, dst, width, stride_move, geo.block_size, geo.stride_block / w,
      geo.stride_token / w, geo.stride_head / w, row_words, num_cols);
  return cudaGetLastError();
}

}  // namespace

int kv_word_bytes(const KVGeometry& geo) {
  for (int w : {16, 8, 4, 2}) {
    if (geo.row_bytes % w == 0 && geo.stride_block % w == 0 && geo.stride_token % w == 0 &&
        geo.stride_head % w == 0 && geo.base_align % w == 0)
      return w;
  }
  return 1;
}

cudaError_t launch_kv_compact(const int64_t* ptrs, int64_t num_tensors, const int64_t* src,
                              const int64_t* dst, int64_t num_requests, int64_t width,
                              int64_t stride_move, const KVGeometry& geo, cudaStream_t stream) {
  if (num_requests == 0 || width == 0 || num_tensors == 0) return cudaSuccess;
  const auto run = [&](auto word) {
    return launch<decltype(word)>(ptrs, num_tensors, src, dst, num_requests, width, stride_move,
                                  geo, stream);
  };
  switch (kv_word_bytes(geo)) {
    case 16: return run(uint4{});
    case 8: return run(uint2{});
    case 4: return run(uint32_t{});
    case 2: return run(uint16_t{});
    default: return run(uint8_t{});
  }
}

}  // namespace treespec::cuda
