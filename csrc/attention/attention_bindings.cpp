// pybind11 wrapper of the CPU tree attention kernel (csrc/attention/tree_attention_cpu.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "attention/tree_attention_cpu.h"

namespace py = pybind11;

namespace treespec::attention {

namespace {

// Large buffers (cache, query, output) must already be float32 C-contiguous: no silent copies.
using F32 = py::array_t<float, py::array::c_style>;
using I32 = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;
using I64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

void run(const F32& query, const F32& kv_cache, bool k_column_major, const I32& block_table,
         const I64& prefix_lens, const I64& tree_sizes, const I64& offsets, const I64& anc_mask,
         float scale, float soft_cap, F32& out) {
  if (query.ndim() != 3 || kv_cache.ndim() != 4 || block_table.ndim() != 2 || anc_mask.ndim() != 2 ||
      out.ndim() != 3)
    throw std::invalid_argument("tree_attention_cpu: query/out [T, Hq, D], kv_cache [blocks, Hkv, bs, 2D], "
                                "block_table [R, width], anc_mask [T, words]");
  TreeAttentionArgs a;
  a.num_rows = query.shape(0), a.num_q_heads = static_cast<int>(query.shape(1));
  a.head_size = static_cast<int>(query.shape(2));
  a.num_blocks = kv_cache.shape(0), a.num_kv_heads = static_cast<int>(kv_cache.shape(1));
  a.block_size = static_cast<int>(kv_cache.shape(2));
  if (kv_cache.shape(3) != 2 * a.head_size)
    throw std::invalid_argument("tree_attention_cpu: kv_cache's last dim must be 2 * head_size");
  a.num_reqs = block_table.shape(0), a.bt_stride = block_table.shape(1);
  if (prefix_lens.size() != a.num_reqs || tree_sizes.size() != a.num_reqs || offsets.size() != a.num_reqs + 1)
    throw std::invalid_argument("tree_attention_cpu: prefix_lens / tree_sizes need R entries, offsets R + 1");
  if (anc_mask.shape(0) != a.num_rows || out.shape(0) != a.num_rows || out.shape(1) != a.num_q_heads ||
      out.shape(2) != a.head_size)
    throw std::invalid_argument("tree_attention_cpu: anc_mask / out do not match the query rows");
  a.query = query.data(), a.kv_cache = kv_cache.data(), a.k_column_major = k_column_major;
  a.block_table = block_table.data(), a.prefix_lens = prefix_lens.data(), a.tree_sizes = tree_sizes.data();
  a.offsets = offsets.data(), a.anc_mask = anc_mask.data(), a.words = static_cast<int>(anc_mask.shape(1));
  a.scale = scale, a.soft_cap = soft_cap, a.out = out.mutable_data();
  py::gil_scoped_release release;
  tree_attention_cpu(a);
}

}  // namespace

void register_attention(py::module_& m) {
  m.def("tree_attention_cpu", &run, py::arg("query"), py::arg("kv_cache"), py::arg("k_column_major"),
        py::arg("block_table"), py::arg("prefix_lens"), py::arg("tree_sizes"), py::arg("offsets"),
        py::arg("anc_mask"), py::arg("scale"), py::arg("soft_cap"), py::arg("out"),
        "Tree-masked attention of float32 tree rows straight from a CPU paged KV cache "
        "(csrc/attention/tree_attention_cpu.h); writes out [T, Hq, D].");
}

}  // namespace treespec::attention
