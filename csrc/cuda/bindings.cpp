// Torch ops over the CUDA launchers (module vllm_treespec._C_cuda, built with
// TREESPEC_BUILD_CUDA=1): torch.ops.treespec_cuda.greedy_tree_accept / kv_compact.
// Python wrappers with argument checks: kernels/cuda_ops.py.
#include <Python.h>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <tuple>

#include "launchers.h"

namespace treespec::cuda {
namespace {

void check_cuda(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, what, ": ", cudaGetErrorString(err));
}

void check_int64_cuda(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.scalar_type() == at::kLong && t.is_contiguous(), name,
              " must be a contiguous int64 CUDA tensor");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> greedy_tree_accept(
    const at::Tensor& offsets, const at::Tensor& tokens, const at::Tensor& parents,
    const at::Tensor& target, int64_t width) {
  check_int64_cuda(offsets, "offsets");
  check_int64_cuda(tokens, "tokens");
  check_int64_cuda(parents, "parents");
  check_int64_cuda(target, "target");
  TORCH_CHECK(width >= 1 && width <= INT32_MAX, "width must be >= 1");
  const c10::cuda::CUDAGuard guard(offsets.device());
  const int64_t b = offsets.numel() - 1;
  TORCH_CHECK(b >= 0, "offsets must have B+1 entries");
  auto opts = offsets.options();
  at::Tensor emitted = at::empty({b, width}, opts);
  at::Tensor nodes = at::empty({b, width}, opts);
  at::Tensor count = at::empty({b}, opts);
  check_cuda(launch_greedy_tree_accept(offsets.data_ptr<int64_t>(), tokens.data_ptr<int64_t>(),
                                       parents.data_ptr<int64_t>(), target.data_ptr<int64_t>(),
                                       emitted.data_ptr<int64_t>(), nodes.data_ptr<int64_t>(),
                                       count.data_ptr<int64_t>(), b, static_cast<int>(width),
                                       c10::cuda::getCurrentCUDAStream()),
             "greedy_tree_accept");
  return {emitted, nodes, count};
}

// geometry: block_size, stride_block, stride_token, stride_head, num_heads, row_bytes,
// base_align (bytes; see KVGeometry).
void kv_compact(const at::Tensor& ptrs, const at::Tensor& src, const at::Tensor& dst,
                at::IntArrayRef geometry) {
  check_int64_cuda(ptrs, "ptrs");
  TORCH_CHECK(src.is_cuda() && dst.is_cuda() && src.scalar_type() == at::kLong &&
                  dst.scalar_type() == at::kLong && src.dim() == 2 && src.sizes() == dst.sizes() &&
                  src.strides() == dst.strides() && src.stride(1) == 1,
              "src/dst must be int64 CUDA [B, W] with matching row-major strides");
  TORCH_CHECK(geometry.size() == 7, "geometry needs 7 entries");
  const KVGeometry geo{geometry[0], geometry[1], geometry[2], geometry[3],
                       geometry[4], geometry[5], geometry[6]};
  const c10::cuda::CUDAGuard guard(ptrs.device());
  check_cuda(launch_kv_compact(ptrs.data_ptr<int64_t>(), ptrs.numel(), src.data_ptr<int64_t>(),
                               dst.data_ptr<int64_t>(), src.size(0), src.size(1), src.stride(0),
                               geo, c10::cuda::getCurrentCUDAStream()),
             "kv_compact");
}

}  // namespace
}  // namespace treespec::cuda

TORCH_LIBRARY(treespec_cuda, m) {
  m.def("greedy_tree_accept(Tensor offsets, Tensor tokens, Tensor parents, Tensor target, "
        "int width) -> (Tensor, Tensor, Tensor)");
  // Writes through the pointer table (memory torch does not see as an argument).
  m.def("kv_compact(Tensor ptrs, Tensor src, Tensor dst, int[] geometry) -> ()");
}

TORCH_LIBRARY_IMPL(treespec_cuda, CUDA, m) {
  m.impl("greedy_tree_accept", &treespec::cuda::greedy_tree_accept);
  m.impl("kv_compact", &treespec::cuda::kv_compact);
}

// Importing the module loads the library, which registers the ops above.
PyMODINIT_FUNC PyInit__C_cuda() {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C_cuda", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}
