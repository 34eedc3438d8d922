// y = x W^T with W in 4-bit levels and x quantized to 8 bits, both per group of 32 input
// channels, summed as integers: the arithmetic of GGUF's Q4_1 x Q8_1 dot product, for CPUs with
// AVX2, FMA and F16C. Built by dcoco/model/w4a8_kernel.py; the op's schema and shapes are there.
//
// Each output is computed the same way whatever the number of rows or threads (a fixed order of
// operations per row and column; built with -ffp-contract=off), so a row's result does not depend
// on the rows beside it.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t GROUP = 32;

// One group of a weight row, 20 bytes: w = scale * level + low for its 32 levels in 0..15, held
// as nibbles: byte j has level j in its low half and level j + 16 in its high half.
struct WeightGroup {
  uint16_t scale;  // fp16
  uint16_t low;    // fp16
  uint8_t levels[16];
};
static_assert(sizeof(WeightGroup) == 20, "a weight group is 20 bytes");

// One group of an activation row: x = scale * q, and scale * sum(q) for the low term.
struct ActivationGroup {
  int8_t q[GROUP];
  float scale;
  float scaled_sum;
};
static_assert(offsetof(WeightGroup, low) == 2 && offsetof(ActivationGroup, scaled_sum) ==
              offsetof(ActivationGroup, scale) + 4, "the kernel loads each pair as one");

template <typename T>
void quantize(const T* x, int64_t groups, ActivationGroup* out) {
  for (int64_t i = 0; i < groups; ++i) {
    const T* v = x + i * GROUP;
    float amax = 0.f;
    for (int j = 0; j < GROUP; ++j) amax = std::max(amax, std::fabs(static_cast<float>(v[j])));
    float scale = amax / 127.f;
    float inverse = scale > 0.f ? 1.f / scale : 0.f;
    int sum = 0;
    for (int j = 0; j < GROUP; ++j) {
      int q = static_cast<int>(std::nearbyint(static_cast<float>(v[j]) * inverse));
      out[i].q[j] = static_cast<int8_t>(q);
      sum += q;
    }
    out[i].scale = scale;
    out[i].scaled_sum = scale * static_cast<float>(sum);
  }
}

inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// R activation rows (x, `groups` groups each) against one weight row w; out[r * stride].
template <int R>
void dot_rows(const ActivationGroup* __restrict x, int64_t groups,
              const WeightGroup* __restrict w, float* __restrict out, int64_t stride) {
  __m256 acc[R];
  __m128 lows[R];  // lane 1: the sum of the groups' minimum terms, low * scale_x * sum(q)
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    lows[r] = _mm_setzero_ps();
  }
  const __m128i nibble = _mm_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < groups; ++g) {
    __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[g].levels));
    __m256i levels = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), nibble),
                                      _mm_and_si128(packed, nibble));  // 32 x u8
    // One conversion gives the group's scale and minimum, one multiply by the activation
    // group's (scale, scaled_sum) both terms' factors: two vector ops where scalar ones took six.
    int32_t halves;
    std::memcpy(&halves, &w[g].scale, sizeof(halves));
    const __m128 weight_pair = _mm_cvtph_ps(_mm_cvtsi32_si128(halves));  // scale, low, 0, 0
    for (int r = 0; r < R; ++r) {
      const ActivationGroup& a = x[r * groups + g];
      __m128 pair = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(&a.scale)));
      __m128 product = _mm_mul_ps(weight_pair, pair);  // scale * a.scale, low * a.scaled_sum
      __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q));
      __m256i sums = _mm256_madd_epi16(_mm256_maddubs_epi16(levels, q), ones);  // 8 x i32
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_broadcastss_ps(product), acc[r]);
      lows[r] = _mm_add_ps(lows[r], product);
    }
  }
  for (int r = 0; r < R; ++r)
    out[r * stride] = horizontal_sum(acc[r]) + _mm_cvtss_f32(_mm_shuffle_ps(lows[r], lows[r], 1));
}

template <typename T>
at::Tensor run(const at::Tensor& x, const at::Tensor& weight) {
  const int64_t m = x.size(0), k = x.size(1), n = weight.size(0), groups = k / GROUP;
  std::vector<ActivationGroup> rows(m * groups);
  quantize(x.data_ptr<T>(), m * groups, rows.data());
  std::vector<float> out(m * n);
  const auto* w = reinterpret_cast<const WeightGroup*>(weight.data_ptr<uint8_t>());
  const ActivationGroup* a = rows.data();
  float* o = out.data();
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      const WeightGroup* wj = w + j * groups;
      int64_t r = 0;
      for (; r + 4 <= m; r += 4) dot_rows<4>(a + r * groups, groups, wj, o + r * n + j, n);
      switch (m - r) {
        case 3: dot_rows<3>(a + r * groups, groups, wj, o + r * n + j, n); break;
        case 2: dot_rows<2>(a + r * groups, groups, wj, o + r * n + j, n); break;
        case 1: dot_rows<1>(a + r * groups, groups, wj, o + r * n + j, n); break;
        default: break;
      }
    }
  });
  at::Tensor result = at::empty({m, n}, x.options());
  T* y = result.data_ptr<T>();
  for (int64_t i = 0; i < m * n; ++i) y[i] = static_cast<T>(out[i]);
  return result;
}

at::Tensor w4a8_linear(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "w4a8_linear: x must be a contiguous [M, K] matrix");
  TORCH_CHECK(x.size(1) % GROUP == 0, "w4a8_linear: K must be a multiple of 32, got ", x.size(1));
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous() && weight.scalar_type() == at::kByte,
              "w4a8_linear: the weight must be contiguous [N, K / 32 * 20] uint8");
  TORCH_CHECK(weight.size(1) == x.size(1) / GROUP * static_cast<int64_t>(sizeof(WeightGroup)),
              "w4a8_linear: the weight holds ", weight.size(1), " bytes a row; K = ", x.size(1),
              " needs ", x.size(1) / GROUP * static_cast<int64_t>(sizeof(WeightGroup)));
  if (x.scalar_type() == at::kBFloat16) return run<c10::BFloat16>(x, weight);
  TORCH_CHECK(x.scalar_type() == at::kFloat, "w4a8_linear: x must be bf16 or fp32");
  return run<float>(x, weight);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(dcoco, m) {
  m.def("w4a8_linear(Tensor x, Tensor weight) -> Tensor");
  m.impl("w4a8_linear", c10::DispatchKey::CPU, &w4a8_linear);
}
