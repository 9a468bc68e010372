// Row argmax kernels: a portable form, and an AVX2 form chosen at run time on x86-64 CPUs that
// have it. The extension is built without -march flags (one wheel for every x86-64 CPU), so the
// portable loop compiles to SSE2 at best; the AVX2 form reads 16 logits per iteration in two
// independent (max, first index) accumulators, which is what a 49152-wide row needs to cost about
// what vLLM's vectorised argmax costs.
#include "row_argmax.h"

#include <cstring>
#include <limits>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define TREESPEC_HAVE_AVX2_DISPATCH 1
#endif

namespace treespec::verify {
namespace {

inline float bf16_to_float(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float x;
  std::memcpy(&x, &wide, sizeof x);
  return x;
}

// Lanes that each hold (largest value seen, first index of it), merged: the largest value, ties
// to the smaller index.
struct MaxAt {
  float value;
  int64_t at;
};

template <class Index>
MaxAt merge_lanes(const float* lane_max, const Index* lane_at, int lanes) {
  MaxAt best{lane_max[0], static_cast<int64_t>(lane_at[0])};
  for (int k = 1; k < lanes; ++k)
    if (lane_max[k] > best.value || (lane_max[k] == best.value && lane_at[k] < best.at))
      best = {lane_max[k], static_cast<int64_t>(lane_at[k])};
  return best;
}

// kLanes independent (max, first index) pairs, so the comparisons do not form one long chain;
// lanes are merged by value, then by the smaller index. A NaN never wins a `>` comparison, so rows
// holding one are rescanned for the first NaN (NaN logits are an error upstream; rare).
template <class Load>
int64_t portable_argmax(const Load& load, int64_t v) {
  constexpr int kLanes = 8;
  float lane_max[kLanes];
  int64_t lane_at[kLanes];
  bool nan = false;
  for (int k = 0; k < kLanes; ++k) {
    lane_max[k] = -std::numeric_limits<float>::infinity();
    lane_at[k] = v;                       // none yet: any real index is smaller
  }
  int64_t i = 0;
  for (; i + kLanes <= v; i += kLanes)
    for (int k = 0; k < kLanes; ++k) {
      const float x = load(i + k);
      nan |= x != x;
      if (x > lane_max[k] || (lane_at[k] == v && x == lane_max[k])) {
        lane_max[k] = x;
        lane_at[k] = i + k;
      }
    }
  for (int k = 0; i < v; ++i, ++k) {
    const float x = load(i);
    nan |= x != x;
    if (x > lane_max[k] || (lane_at[k] == v && x == lane_max[k])) {
      lane_max[k] = x;
      lane_at[k] = i;
    }
  }
  if (nan)
    for (i = 0; i < v; ++i)
      if (load(i) != load(i)) return i;
  return merge_lanes(lane_max, lane_at, kLanes).at;
}

#ifdef TREESPEC_HAVE_AVX2_DISPATCH

constexpr int64_t kBlock = 16;   // two 8-float vectors per iteration

__attribute__((target("avx2"))) inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

__attribute__((target("avx2"))) inline __m256 load8(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

inline float load1(const float* p) { return *p; }
inline float load1(const uint16_t* p) { return bf16_to_float(*p); }

// Each of the 16 lanes keeps the first index of the largest value among the indices it sees
// (strict `>` after seeding from the first block), so merging lanes by value and then by the
// smaller index gives the row's first largest. Indices are int32: callers pass v < 2^31.
template <class T>
__attribute__((target("avx2"))) int64_t avx2_argmax(const T* row, int64_t v) {
  __m256 max_a = load8(row), max_b = load8(row + 8);
  __m256i at_a = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256i at_b = _mm256_add_epi32(at_a, _mm256_set1_epi32(8));
  __m256 unordered = _mm256_or_ps(_mm256_cmp_ps(max_a, max_a, _CMP_UNORD_Q),
                                  _mm256_cmp_ps(max_b, max_b, _CMP_UNORD_Q));
  const __m256i step = _mm256_set1_epi32(kBlock);
  __m256i idx_a = at_a, idx_b = at_b;
  int64_t i = kBlock;
  for (; i + kBlock <= v; i += kBlock) {
    idx_a = _mm256_add_epi32(idx_a, step);
    idx_b = _mm256_add_epi32(idx_b, step);
    const __m256 x_a = load8(row + i), x_b = load8(row + i + 8);
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(x_a, x_b, _CMP_UNORD_Q));
    const __m256 gt_a = _mm256_cmp_ps(x_a, max_a, _CMP_GT_OQ);
    const __m256 gt_b = _mm256_cmp_ps(x_b, max_b, _CMP_GT_OQ);
    max_a = _mm256_blendv_ps(max_a, x_a, gt_a);
    max_b = _mm256_blendv_ps(max_b, x_b, gt_b);
    at_a = _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(at_a), _mm256_castsi256_ps(idx_a), gt_a));
    at_b = _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(at_b), _mm256_castsi256_ps(idx_b), gt_b));
  }
  bool nan = _mm256_movemask_ps(unordered) != 0;
  alignas(32) float lane_max[kBlock];
  alignas(32) int32_t lane_at[kBlock];
  _mm256_store_ps(lane_max, max_a);
  _mm256_store_ps(lane_max + 8, max_b);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lane_at), at_a);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lane_at + 8), at_b);
  auto [best, at] = merge_lanes(lane_max, lane_at, kBlock);
  for (; i < v; ++i) {          // the tail: every index here is larger than any lane's
    const float x = load1(row + i);
    nan |= x != x;
    if (x > best) {
      best = x;
      at = i;
    }
  }
  if (nan)
    for (i = 0; i < v; ++i)
      if (load1(row + i) != load1(row + i)) return i;
  return at;
}

bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

bool use_avx2(int64_t v) {
  return v >= kBlock && v < (int64_t{1} << 31) && cpu_has_avx2();
}

#endif  // TREESPEC_HAVE_AVX2_DISPATCH

}  // namespace

int64_t row_argmax_f32_portable(const float* row, int64_t v) {
  return portable_argmax([row](int64_t j) { return row[j]; }, v);
}

int64_t row_argmax_bf16_portable(const uint16_t* row, int64_t v) {
  return portable_argmax([row](int64_t j) { return bf16_to_float(row[j]); }, v);
}

int64_t row_argmax_f32(const float* row, int64_t v) {
#ifdef TREESPEC_HAVE_AVX2_DISPATCH
  if (use_avx2(v)) return avx2_argmax(row, v);
#endif
  return row_argmax_f32_portable(row, v);
}

int64_t row_argmax_bf16(const uint16_t* row, int64_t v) {
#ifdef TREESPEC_HAVE_AVX2_DISPATCH
  if (use_avx2(v)) return avx2_argmax(row, v);
#endif
  return row_argmax_bf16_portable(row, v);
}

}  // namespace treespec::verify
