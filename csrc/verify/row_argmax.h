// Argmax of one logits row with torch.argmax's rule: the first index of the largest value, a NaN
// counting as the largest (the first NaN wins). vLLM's greedy sampler uses the same rule; the
// host greedy walk (greedy_walk.cpp) must reproduce its tokens bitwise.
#pragma once

#include <cstdint>

namespace treespec::verify {

// row[0..v) of float32; v >= 1.
int64_t row_argmax_f32(const float* row, int64_t v);
// row[0..v) of bfloat16 bits (the high half of a float32); v >= 1.
int64_t row_argmax_bf16(const uint16_t* row, int64_t v);

// The portable forms, without SIMD dispatch (the tests hold both forms to torch.argmax).
int64_t row_argmax_f32_portable(const float* row, int64_t v);
int64_t row_argmax_bf16_portable(const uint16_t* row, int64_t v);

}  // namespace treespec::verify
