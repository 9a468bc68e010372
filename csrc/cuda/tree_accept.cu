// Greedy tree acceptance on the GPU: one block per request, no host sync.
//
// From the root, emit the target argmax x of the current node's row; descend into the child
// whose token is x (siblings carry distinct tokens, so it is unique), else stop: x is the bonus
// token. Children always come after their parent (parents[i] < i), so each level scans only the
// nodes past the current one, spread over the block's threads; the match is published through
// shared memory. Same outputs as kernels/tree_accept.py and csrc/verify/greedy_walk.cpp.
#include <climits>

#include "launchers.h"

namespace treespec::cuda {
namespace {

constexpr int kThreads = 128;

__global__ void greedy_tree_accept_kernel(const int64_t* __restrict__ offsets,
                                          const int64_t* __restrict__ tokens,
                                          const int64_t* __restrict__ parents,
                                          const int64_t* __restrict__ target,
                                          int64_t* __restrict__ emitted,
                                          int64_t* __restrict__ nodes,
                                          int64_t* __restrict__ num_emitted, int width) {
  __shared__ int s_child;
  const int64_t r = blockIdx.x;
  const int64_t start = offsets[r];
  const int n = static_cast<int>(offsets[r + 1] - start);
  int64_t* em = emitted + r * width;
  int64_t* nd = nodes + r * width;
  int cur = 0;
  int count = 0;
  while (count < width) {  // uniform across the block: every decision comes from s_child
    const int64_t x = target[start + cur];
    if (threadIdx.x == 0) s_child = INT_MAX;
    __syncthreads();
    for (int i = cur + 1 + threadIdx.x; i < n; i += blockDim.x)
      if (parents[start + i] == cur && tokens[start + i] == x) atomicMin(&s_child, i);
    __syncthreads();
    const int child = s_child;
    __syncthreads();  // everyone has read s_child before thread 0 resets it
    const bool descend = child != INT_MAX && count + 1 < width;
    if (threadIdx.x == 0) {
      em[count] = x;
      nd[count] = descend ? child : -1;
    }
    ++count;
    if (!descend) break;
    cur = child;
  }
  for (int level = count + threadIdx.x; level < width; level += blockDim.x) {
    em[level] = -1;
    nd[level] = -1;
  }
  if (threadIdx.x == 0) num_emitted[r] = count;
}

}  // namespace

cudaError_t launch_greedy_tree_accept(const int64_t* offsets, const int64_t* tokens,
                                      const int64_t* parents, const int64_t* target,
                                      int64_t* emitted, int64_t* nodes, int64_t* num_emitted,
                                      int64_t num_requests, int width, cudaStream_t stream) {
  if (num_requests == 0) return cudaSuccess;
  if (width < 1 || num_requests > INT_MAX) return cudaErrorInvalidValue;
  greedy_tree_accept_kernel<<<static_cast<unsigned>(num_requests), kThreads, 0, stream>>>(
      offsets, tokens, parents, target, emitted, nodes, num_emitted, width);
  return cudaGetLastError();
}

}  // namespace treespec::cuda
