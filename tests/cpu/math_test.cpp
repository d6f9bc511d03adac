// SPDX-License-Identifier: Apache-2.0
// The CPU backend's building blocks against plain definitions: math::exp within its documented
// bound (2 ulp) and monotonic over every 61st float of [-104, 89]; sigmoid_row within 3 ulp
// and monotonic over [-89, 104], and the fused sigmoid pass equal to its separate passes;
// math::log within 1e-15 of
// libm's over every binade; math::exp (double) / exp_lanes within 2.5e-16 of libm's exp, 0 /
// subnormal / inf at the ends, its 8-lane form bit for bit its scalar one; the selection (top_n,
// with and without a mask, every n up to 16 and the index-sort path; top_n_columns, 16 rows at once
// by insertion or by sorting networks, where AVX-512 has it) equal to a stable sort by (value desc,
// index asc) on rows full of ties, -inf, -FLT_MAX and +-FLT_MAX; the row kernels' 16-column bf16
// load / store bit for bit equal to dtype's conversions; the row copy byte for byte.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <moeroute/cpu/detail/math.hpp>
#include <moeroute/cpu/detail/rows.hpp>
#include <moeroute/cpu/detail/select.hpp>
#include <moeroute/cpu/detail/select_columns.hpp>
#include <moeroute/dtype.hpp>
#include <moeroute/exp_fma.hpp>
#include <moeroute/macros.hpp>

using namespace moeroute::cpu;

TEST_CASE("cpu math::exp is within 2 ulp of exp and monotonic", "[cpu][math]") {
  double worst = 0.0;
  float worst_at = 0.0f, prev = 0.0f;
  std::int64_t checked = 0;
  for (std::uint32_t u = std::bit_cast<std::uint32_t>(-104.0f); u >= 0x80000000u; u -= 61) {
    const float y = std::bit_cast<float>(u);  // -104 .. -0, toward zero
    const float got = math::exp(y);
    const double want = std::exp(static_cast<double>(y));
    const double ulp = std::ldexp(1.0, std::max(std::ilogb(static_cast<float>(want)), -126) - 23);
    const double err = std::fabs(got - want) / ulp;
    if (err > worst) {
      worst = err;
      worst_at = y;
    }
    if (got < prev) FAIL("not monotonic at " << y);
    prev = got;
    ++checked;
  }
  for (std::uint32_t u = 0; std::bit_cast<float>(u) <= 89.0f; u += 61) {
    const float y = std::bit_cast<float>(u);
    const float got = math::exp(y);
    const double want = std::exp(static_cast<double>(y));
    if (want > FLT_MAX) {
      REQUIRE(std::isinf(got));
      continue;
    }
    const double ulp = std::ldexp(1.0, std::max(std::ilogb(static_cast<float>(want)), -126) - 23);
    const double err = std::fabs(got - want) / ulp;
    if (err > worst) {
      worst = err;
      worst_at = y;
    }
    if (got < prev) FAIL("not monotonic at " << y);
    prev = got;
    ++checked;
  }
  INFO("worst " << worst << " ulp at " << worst_at << " over " << checked << " arguments");
  CHECK(checked > 30000000);
  REQUIRE(worst <= 2.0);
  REQUIRE(math::exp(-200.0f) == 0.0f);
  REQUIRE(math::exp(0.0f) == 1.0f);
}

#if defined(__AVX2__) && defined(__FMA__)
// Every float of a softmax's range, [-104, 0] (below -104 exp clamps: one value), through
// exp_row's vector path (exp16 or exp8: the token columns' bits): monotonic without exception.
// The columns count a Megatron token's fresh top-k of P by comparing one P only, which holds
// because P keeps the logits' order (gating.hpp, gate_columns); one step back anywhere would
// break it. (Builds without the columns, whose exp is scalar, skip it: 10^9 exps.)
TEST_CASE("cpu math::exp_row is monotonic over every float of [-104, 0]", "[cpu][math]") {
  constexpr std::uint32_t chunk = 1u << 16;
  std::vector<float> y(chunk), got(chunk);
  const std::uint32_t last = std::bit_cast<std::uint32_t>(-104.0f);  // (bits from -0 up to it)
  float prev = 2.0f;  // exp of the float before the chunk (2: above every exp of y <= 0)
  std::int64_t checked = 0, steps_up = 0;
  float first = 0.0f;
  for (std::uint64_t b = 0x80000000u; b <= last; b += chunk) {
    // (the chunk's floats toward -104: exp must never grow)
    const auto n = static_cast<std::uint32_t>(std::min<std::uint64_t>(chunk, last + 1 - b));
    for (std::uint32_t i = 0; i < n; ++i)
      y[i] = std::bit_cast<float>(static_cast<std::uint32_t>(b + i));
    (void)math::exp_row(y.data(), static_cast<std::int32_t>(n), 0.0f, got.data());
    std::int64_t up = got[0] > prev;
    for (std::uint32_t i = 1; i < n; ++i) up += got[i] > got[i - 1];
    if (up != 0 && steps_up == 0)
      for (std::uint32_t i = 0; i < n; ++i)
        if (got[i] > (i == 0 ? prev : got[i - 1])) {
          first = y[i];
          break;
        }
    steps_up += up;
    prev = got[n - 1];
    checked += n;
  }
  INFO(steps_up << " steps up of " << checked << ", the first at " << first);
  CHECK(checked == std::int64_t{last} - 0x80000000 + 1);
  REQUIRE(steps_up == 0);
}
#endif

namespace {
/// Every 61st float of [lo, 0] and [0, hi] (lo < 0 < hi), in increasing order: the row
/// kernels' test grid.
std::vector<float> every_61st_float(float lo, float hi) {
  std::vector<float> v;
  for (std::uint32_t u = std::bit_cast<std::uint32_t>(lo); u >= 0x80000000u; u -= 61)
    v.push_back(std::bit_cast<float>(u));
  for (std::uint32_t u = 0; std::bit_cast<float>(u) <= hi; u += 61)
    v.push_back(std::bit_cast<float>(u));
  return v;
}
}  // namespace

// The row kernels take their own vector path where the ISA has one (exp16 on AVX-512): the
// same bound and monotonicity over the same grid, a row of 4093 at a time (a ragged tail).
TEST_CASE("cpu math::exp_row is within exp's bound", "[cpu][math]") {
  const std::vector<float> y = every_61st_float(-104.0f, 89.0f);
  constexpr std::int32_t row = 4093;
  std::vector<float> got(row);
  double worst = 0.0;
  float worst_at = 0.0f, prev = 0.0f;
  for (std::size_t at = 0; at < y.size(); at += row) {
    const auto n = static_cast<std::int32_t>(std::min<std::size_t>(row, y.size() - at));
    const float* x = y.data() + at;
    (void)math::exp_row(x, n, 0.0f, got.data());
    for (std::int32_t i = 0; i < n; ++i) {
      const double want = std::exp(static_cast<double>(x[i]));
      if (want > FLT_MAX) {
        REQUIRE(std::isinf(got[i]));
        continue;
      }
      const double ulp = std::ldexp(1.0, std::max(std::ilogb(static_cast<float>(want)), -126) - 23);
      const double err = std::fabs(got[i] - want) / ulp;
      if (err > worst) {
        worst = err;
        worst_at = x[i];
      }
      if (got[i] < prev) FAIL("exp_row not monotonic at " << x[i]);
      prev = got[i];
    }
  }
  INFO("worst " << worst << " ulp at " << worst_at);
  REQUIRE(worst <= 2.0);
}

namespace {
// exp_row of every 61st float of [lo, hi], in rows of 4093 (a ragged tail), against want(y) bit
// for bit: FAILs with the count and the first float that differs
template <class Want>
void require_exp_row_bits(float lo, float hi, Want&& want) {
  const std::vector<float> y = every_61st_float(lo, hi);
  std::vector<float> got(4093);
  std::int64_t differs = 0;
  float first = 0.0f;
  for (std::size_t at = 0; at < y.size(); at += got.size()) {
    const auto n = static_cast<std::int32_t>(std::min(got.size(), y.size() - at));
    (void)math::exp_row(y.data() + at, n, 0.0f, got.data());
    for (std::int32_t i = 0; i < n; ++i)
      if (std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(want(y[at + i]))) {
        if (differs++ == 0) first = y[at + i];
      }
  }
  INFO(differs << " differ, the first at " << first);
  REQUIRE(differs == 0);
}
}  // namespace

// exp_row's vector paths (exp16 on AVX-512, exp8 on AVX2 + FMA) give exp()'s bits, compiled
// with the same contraction (this target's default): one exp, whatever ISA the row takes.
TEST_CASE("cpu math::exp_row equals exp() bit for bit", "[cpu][math]") {
  require_exp_row_bits(-104.0f, 89.0f, [](float y) { return math::exp(y); });
}

#if defined(__AVX2__) && defined(__FMA__)
// ... and where exp_row is vector code (exp16 / exp8: explicit fused multiply-adds), those bits
// are moeroute::exp_fma's, the GPU gating's exp, whatever this target's contraction: the CPU
// backend and the kernels make the same exps.
TEST_CASE("cpu math::exp_row equals moeroute::exp_fma bit for bit", "[cpu][math]") {
  require_exp_row_bits(-110.0f, 95.0f, [](float y) { return moeroute::exp_fma(y); });
  REQUIRE(moeroute::exp_fma(0.0f) == 1.0f);
  REQUIRE(moeroute::exp_fma(-200.0f) == 0.0f);
  REQUIRE(std::isinf(moeroute::exp_fma(100.0f)));
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
// exp8_moderate (the token columns' exp on AVX2 where a tile's logits lie within 86 of their
// max) gives exp8's bits, which are exp()'s, over every 13th float of [-86, 0] and its ends
TEST_CASE("cpu math::exp8_moderate equals exp() bit for bit on [-86, 0]", "[cpu][math]") {
  // (the floats' bits run from -0 up to -86's)
  const std::uint32_t first_bits = std::bit_cast<std::uint32_t>(-0.0f),
                      last_bits = std::bit_cast<std::uint32_t>(math::exp8_moderate_min);
  std::int64_t checked = 0, differs = 0;
  float first = 0.0f;
  const auto check = [&](const float* y) {
    float got[8];
    _mm256_storeu_ps(got, math::exp8_moderate(_mm256_loadu_ps(y)));
    for (std::int32_t i = 0; i < 8; ++i, ++checked)
      if (std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(math::exp(y[i])))
        if (differs++ == 0) first = y[i];
  };
  for (std::uint32_t b = first_bits; b <= last_bits - 8 * 13; b += 8 * 13) {
    float y[8];
    for (std::uint32_t i = 0; i < 8; ++i) y[i] = std::bit_cast<float>(b + 13 * i);
    check(y);
  }
  const float ends[8] = {math::exp8_moderate_min,
                         0.0f,
                         -0.0f,
                         -1e-30f,
                         -85.99999f,
                         -1.0f,
                         -0.5f,
                         -std::numeric_limits<float>::denorm_min()};
  check(ends);
  INFO(differs << " of " << checked << " differ, the first at " << first);
  CHECK(checked > 80000000);
  REQUIRE(differs == 0);
}
#endif

// sigmoid_row (sigmoid16's own exp on AVX-512, math::exp elsewhere) against the exact sigmoid
// over every 61st float of [-89, 104], rows of 4093: within 3 ulp where exp(-x) is finite, 0
// where it overflows (as the reference's float formula gives), monotonic; the non-finite
// inputs as their sanitised values.
TEST_CASE("cpu math::sigmoid_row is within 3 ulp of the sigmoid and monotonic", "[cpu][math]") {
  const std::vector<float> x = every_61st_float(-89.0f, 104.0f);
  constexpr std::size_t row = 4093;
  float s[row], prev = 0.0f;
  double worst = 0.0;
  float worst_at = 0.0f;
  for (std::size_t at = 0; at < x.size(); at += row) {
    const std::size_t n = std::min(row, x.size() - at);
    math::sigmoid_row(x.data() + at, static_cast<std::int32_t>(n), s);
    for (std::size_t i = 0; i < n; ++i) {
      const float v = x[at + i];
      if (s[i] < prev) FAIL("not monotonic at " << v);
      prev = s[i];
      const double e = std::exp(-static_cast<double>(v));
      if (std::isinf(static_cast<float>(e))) {
        REQUIRE(s[i] == 0.0f);
        continue;
      }
      const double want = 1.0 / (1.0 + e);
      const double ulp = std::ldexp(1.0, std::max(std::ilogb(static_cast<float>(want)), -126) - 23);
      const double err = std::fabs(s[i] - want) / ulp;
      if (err > worst) {
        worst = err;
        worst_at = v;
      }
    }
  }
  INFO("worst " << worst << " ulp at " << worst_at << " over " << x.size() << " arguments");
  CHECK(x.size() > 30000000);
  REQUIRE(worst <= 3.0);
  const float special[] = {NAN, INFINITY, -INFINITY, FLT_MAX, -FLT_MAX, 0.0f, -0.0f, 200.0f};
  const float want[] = {0.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.5f, 0.5f, 1.0f};
  float got[std::size(special)];
  math::sigmoid_row(special, static_cast<std::int32_t>(std::size(special)), got);
  for (std::size_t i = 0; i < std::size(special); ++i) {
    INFO("sigmoid(" << special[i] << ")");
    REQUIRE(std::bit_cast<std::uint32_t>(got[i]) == std::bit_cast<std::uint32_t>(want[i]));
  }
}

#if defined(MOEROUTE_CPU_FUSED_SIGMOID)
// sigmoid_row_fused, the one pass of DeepSeek-V3's scores, against the passes it replaces:
// load_row, sigmoid_row of the sanitised row, + bias, sum_row_f32 — the same bits — on clean
// rows and on rows with NaN / Inf / FLT_MAX (counted, sanitised).
TEST_CASE("cpu math::sigmoid_row_fused equals its separate passes", "[cpu][math]") {
  constexpr std::int32_t n = 256;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> row(n), bias(n), x(n), scores(n), sel(n), x2(n), s2(n);
  for (auto& b : bias) b = normal(rng) * 0.01f;
  const float odd[] = {NAN, INFINITY, -INFINITY, FLT_MAX, -FLT_MAX, 100.0f, -100.0f};
  for (int trial = 0; trial < 200; ++trial) {
    for (auto& v : row) v = normal(rng);
    for (int j = 0; j < trial % 5; ++j)  // 0 to 4 odd values at random places
      row[rng() % n] = odd[rng() % std::size(odd)];
    std::int64_t bad = 0, bad2 = 0;
    float sum = 0.0f;
    const bool with_bias = trial % 2 == 0;
    const float m = math::sigmoid_row_fused(row.data(), n, with_bias ? bias.data() : nullptr,
                                            x.data(), scores.data(), sel.data(), bad, sum);
    const float m2 = math::load_row(row.data(), n, x2.data(), bad2);
    math::sigmoid_row(x2.data(), n, s2.data());
    INFO("trial " << trial);
    REQUIRE(m == m2);
    REQUIRE(bad == bad2);
    REQUIRE(std::memcmp(x.data(), x2.data(), n * sizeof(float)) == 0);
    REQUIRE(std::memcmp(scores.data(), s2.data(), n * sizeof(float)) == 0);
    REQUIRE(std::bit_cast<std::uint32_t>(sum) ==
            std::bit_cast<std::uint32_t>(math::sum_row_f32(s2.data(), n)));
    for (std::int32_t i = 0; with_bias && i < n; ++i) REQUIRE(sel[i] == s2[i] + bias[i]);
  }
}
#endif

// sum_row's order, written out: element i in lane i % 8 of chain i / 8 % 4 (whole groups of
// 8 only), the chains added (0 + 1) + (2 + 3), the lanes folded (j + j+4), (j + j+2), (0 + 1),
// then the tail one by one — the same bits on every ISA build (this file runs on the default
// ISA, AVX2 and the machine's), and exp_row's sum is sum_row of the exps it wrote.
TEST_CASE("cpu math::sum_row adds in its documented order, exp_row's sum is sum_row's",
          "[cpu][math]") {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (std::int32_t n = 1; n <= 300; n += (n < 40 ? 1 : 7)) {
    std::vector<float> v(static_cast<std::size_t>(n)), ex(v.size());
    for (auto& x : v) x = normal(rng) * (rng() % 3 == 0 ? 1e4f : 1.0f);
    double lane[4][8] = {};
    const std::int32_t whole = n / 8 * 8;
    for (std::int32_t i = 0; i < whole; ++i) lane[i / 8 % 4][i % 8] += static_cast<double>(v[i]);
    double c[8], f[4];
    for (int j = 0; j < 8; ++j) c[j] = (lane[0][j] + lane[1][j]) + (lane[2][j] + lane[3][j]);
    for (int j = 0; j < 4; ++j) f[j] = c[j] + c[j + 4];
    double want = (f[0] + f[2]) + (f[1] + f[3]);
    for (std::int32_t i = whole; i < n; ++i) want += static_cast<double>(v[i]);
    INFO("n = " << n);
    REQUIRE(std::bit_cast<std::uint64_t>(math::sum_row(v.data(), n)) ==
            std::bit_cast<std::uint64_t>(want));
    const float m = *std::max_element(v.begin(), v.end());
    const double sum = math::exp_row(v.data(), n, m, ex.data());
    REQUIRE(std::bit_cast<std::uint64_t>(sum) ==
            std::bit_cast<std::uint64_t>(math::sum_row(ex.data(), n)));
  }
}

// exp's bits are the same scalar or in lanes where the caller keeps every rounding
// (MOEROUTE_PRECISE_FP, as the logit gradient's row path does): inlined into code compiled
// with FMA contraction, either may fuse differently. The test calls it from such a region.
MOEROUTE_PRECISE_FP_BEGIN
namespace {
[[gnu::noinline]] double precise_exp(double x) { return math::exp(x); }
[[gnu::noinline]] void precise_exp_lanes(math::f64x8& x) { math::exp_lanes(x); }
// four vectors in lock-step, the full path and the moderate one (x in [-700, 700])
[[gnu::noinline]] void precise_exp_4(math::f64x4 (&x)[4]) { math::exp_lanes(x); }
[[gnu::noinline]] void precise_exp_4_moderate(math::f64x4 (&x)[4]) { math::exp_lanes<4, true>(x); }
[[gnu::noinline]] void precise_exp_2_moderate(math::f64x2 (&x)[2]) { math::exp_lanes<2, true>(x); }
// (8 lanes: AVX-512 builds scale by vscalefpd there, moderate or not)
[[gnu::noinline]] void precise_exp_8_moderate(math::f64x8 (&x)[2]) { math::exp_lanes<2, true>(x); }
// (8 lanes, the full path: AVX-512 builds round n by vrndscalepd and take x - n ln2_hi in one
// vfnmaddpd there)
[[gnu::noinline]] void precise_exp_8(math::f64x8 (&x)[2]) { math::exp_lanes<2>(x); }
}  // namespace
MOEROUTE_PRECISE_FP_END

TEST_CASE("cpu math::exp_lanes: vectors in lock-step and the moderate path give exp's bits",
          "[cpu][math]") {
  std::mt19937_64 rng(12);
  const auto uniform = [&rng](double lo, double hi) {
    return lo + static_cast<double>(rng() >> 11) * 0x1p-53 * (hi - lo);
  };
  std::int64_t differ = 0, differ_moderate = 0;
  for (int i = 0; i < 40000; ++i) {
    math::f64x4 full[4], moderate[4];
    math::f64x2 narrow[2];
    math::f64x8 wide[2], wide_full[2];
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 4; ++l) {
        full[j][l] = uniform(-750.0, 712.0);  // past both ends of the clamp
        moderate[j][l] = (i + l) % 3 == 0 ? uniform(-700.0, 700.0) : uniform(-40.0, 0.0);
      }
    if (i == 0) {  // the moderate range's ends and zeros
      moderate[0] = math::f64x4{-700.0, 700.0, 0.0, -0.0};
      moderate[1] = math::f64x4{-699.9999999999999, 699.9999999999999, 1e-300, -1e-300};
    }
    for (int j = 0; j < 2; ++j)
      for (int l = 0; l < 2; ++l) narrow[j][l] = moderate[j][l];
    for (int l = 0; l < 16; ++l) {
      wide[l / 8][l % 8] = moderate[l / 4][l % 4];
      wide_full[l / 8][l % 8] = full[l / 4][l % 4];
    }
    math::f64x4 want_full[4], want_moderate[4];
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 4; ++l) {
        want_full[j][l] = precise_exp(full[j][l]);
        want_moderate[j][l] = precise_exp(moderate[j][l]);
      }
    precise_exp_4(full);
    precise_exp_4_moderate(moderate);
    precise_exp_2_moderate(narrow);
    precise_exp_8_moderate(wide);
    precise_exp_8(wide_full);
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 4; ++l) {
        differ += std::bit_cast<std::uint64_t>(full[j][l]) !=
                  std::bit_cast<std::uint64_t>(want_full[j][l]);
        differ_moderate += std::bit_cast<std::uint64_t>(moderate[j][l]) !=
                           std::bit_cast<std::uint64_t>(want_moderate[j][l]);
      }
    for (int j = 0; j < 2; ++j)
      for (int l = 0; l < 2; ++l)
        differ_moderate += std::bit_cast<std::uint64_t>(narrow[j][l]) !=
                           std::bit_cast<std::uint64_t>(want_moderate[j][l]);
    for (int l = 0; l < 16; ++l) {
      differ_moderate += std::bit_cast<std::uint64_t>(wide[l / 8][l % 8]) !=
                         std::bit_cast<std::uint64_t>(want_moderate[l / 4][l % 4]);
      differ += std::bit_cast<std::uint64_t>(wide_full[l / 8][l % 8]) !=
                std::bit_cast<std::uint64_t>(want_full[l / 4][l % 4]);
    }
  }
  REQUIRE(differ == 0);
  REQUIRE(differ_moderate == 0);
}

TEST_CASE("cpu math::exp(double) is within 2.5e-16 of exp, exp_lanes gives its bits",
          "[cpu][math]") {
  std::mt19937_64 rng(11);
  double worst = 0.0, worst_at = 0.0;
  std::int64_t lanes_differ = 0;
  for (int i = 0; i < 250000; ++i) {
    // the whole normal range, and the softmax's exp(x - max) in [-100, 0] most of the time
    math::f64x8 x;
    for (int l = 0; l < 8; ++l) {
      const double u = static_cast<double>(rng() >> 11) * 0x1p-53;
      x[l] = (i + l) % 2 == 0 ? -708.0 + u * (709.7 + 708.0) : -100.0 * u;
    }
    math::f64x8 got = x;
    precise_exp_lanes(got);
    for (int l = 0; l < 8; ++l) {
      const double scalar = precise_exp(x[l]), want = std::exp(x[l]);
      lanes_differ += std::bit_cast<std::uint64_t>(scalar) != std::bit_cast<std::uint64_t>(got[l]);
      const double err = std::abs(scalar - want) / want;
      if (err > worst) {
        worst = err;
        worst_at = x[l];
      }
    }
  }
  INFO("worst " << worst << " at " << worst_at);
  REQUIRE(worst <= 2.5e-16);  // about 1 ulp
  REQUIRE(lanes_differ == 0);
  // the ends: subnormal results rounded once, 0 below, inf above, 1 at 0
  for (const double x : {-708.5, -720.0, -740.0, -744.9}) {
    const double want = std::exp(x), got = math::exp(x);
    INFO("x = " << x);
    REQUIRE(std::abs(got - want) <= std::ldexp(want, -50) + 0x1p-1074);
  }
  REQUIRE(math::exp(-746.0) == 0.0);
  REQUIRE(math::exp(-1e300) == 0.0);
  REQUIRE(math::exp(709.7) == std::exp(709.7));
  REQUIRE(math::exp(709.8) == std::numeric_limits<double>::infinity());
  REQUIRE(math::exp(1e300) == std::numeric_limits<double>::infinity());
  REQUIRE(math::exp(0.0) == 1.0);
}

TEST_CASE("cpu math::log is within 1e-15 of log over every binade", "[cpu][math]") {
  std::mt19937_64 rng(3);
  double worst = 0.0, worst_at = 0.0;
  std::int64_t lse_differs = 0;
  for (int i = 0; i < 2000000; ++i) {
    // every binade of the normal doubles, and the softmax sums [1, 8192] the gating takes
    const double x = i % 2 == 0 ? std::ldexp(1.0 + static_cast<double>(rng() >> 12) * 0x1p-52,
                                             static_cast<int>(rng() % 2046) - 1022)
                                : 1.0 + static_cast<double>(rng() >> 11) * 0x1p-53 * 8191.0;
    const double got = math::log(x), want = std::log(x);
    const double err = want == 0.0 ? std::abs(got) : std::abs(got - want) / std::abs(want);
    if (err > worst) {
      worst = err;
      worst_at = x;
    }
    const auto m = static_cast<float>(static_cast<int>(rng() % 4000) - 2000) * 0.01f;
    lse_differs += static_cast<float>(m + got) != static_cast<float>(m + want) ? 1 : 0;
  }
  INFO("worst " << worst << " at " << worst_at);
  REQUIRE(worst <= 1e-15);
  CHECK(lse_differs == 0);  // the logsumexp rounds to the reference's float
  REQUIRE(math::log(1.0) == 0.0);
  REQUIRE(math::log(2.0) == std::log(2.0));
}

namespace {
// log_lanes takes its caller's contraction (always inlined): called here as the logit
// gradient calls it, from a precise region
MOEROUTE_PRECISE_FP_BEGIN
/// out[w][l] = log_lanes of x through vectors of 8 (w = 0), 4 (w = 1) and 2 (w = 2) lanes.
void log_lanes_of(const double (&x)[8], double (&out)[3][8]) {
  math::f64x8 v8;
  math::f64x4 v4[2];
  math::f64x2 v2[4];
  std::memcpy(&v8, x, sizeof v8);
  std::memcpy(v4, x, sizeof v4);
  std::memcpy(v2, x, sizeof v2);
  math::log_lanes(v8);
  for (auto& v : v4) math::log_lanes(v);
  for (auto& v : v2) math::log_lanes(v);
  std::memcpy(out[0], &v8, sizeof v8);
  std::memcpy(out[1], v4, sizeof v4);
  std::memcpy(out[2], v2, sizeof v2);
}
MOEROUTE_PRECISE_FP_END
}  // namespace

TEST_CASE("cpu math::log_lanes gives log's bits in every lane", "[cpu][math]") {
  // the inputs of the test above, 8 at a time through each vector width (a wrong exponent or
  // rounding in one lane shows as a differing bit pattern)
  std::mt19937_64 rng(5);
  std::int64_t differs = 0, checked = 0;
  for (int i = 0; i < 200000; ++i) {
    double x[8];
    for (int l = 0; l < 8; ++l)
      x[l] = (i + l) % 2 == 0 ? std::ldexp(1.0 + static_cast<double>(rng() >> 12) * 0x1p-52,
                                           static_cast<int>(rng() % 2046) - 1022)
                              : 1.0 + static_cast<double>(rng() >> 11) * 0x1p-53 * 8191.0;
    if (i == 0) {  // the binade edges and sqrt(1/2)'s neighbours
      x[0] = 1.0;
      x[1] = 0x1.6a09e667f3bcdp-1;
      x[2] = std::nextafter(x[1], 0.0);
      x[3] = 0x1p-1022;
      x[4] = 0x1.fffffffffffffp+1023;
      x[5] = 2.0;
      x[6] = 0.5;
      x[7] = 8192.0;
    }
    double got[3][8];
    log_lanes_of(x, got);
    for (int l = 0; l < 8; ++l) {
      const double want = math::log(x[l]);
      for (const auto& g : got) {
        differs += std::bit_cast<std::uint64_t>(g[l]) != std::bit_cast<std::uint64_t>(want) ? 1 : 0;
        ++checked;
      }
    }
  }
  CHECK(checked == 4800000);
  CHECK(differs == 0);
}

namespace {
/// The n best of v (allowed only), larger value first, ties to the lower index.
std::vector<std::int32_t> plain_top(const std::vector<float>& v, const std::uint8_t* allowed,
                                    std::int32_t n) {
  std::vector<std::int32_t> idx;
  for (std::int32_t i = 0; i < static_cast<std::int32_t>(v.size()); ++i)
    if (allowed == nullptr || allowed[i]) idx.push_back(i);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](std::int32_t a, std::int32_t b) { return v[a] > v[b]; });
  idx.resize(static_cast<std::size_t>(n));
  return idx;
}

/// top_n's n best of v (and their values) and, when enough are allowed, the masked n best,
/// against plain_top.
void check_top_n(const std::vector<float>& v, const std::vector<std::uint8_t>& allowed,
                 std::int32_t allowed_count, std::int32_t n) {
  const auto size = static_cast<std::int32_t>(v.size());
  std::vector<float> vals(v.size());
  std::vector<std::int32_t> ids(v.size());
  std::vector<std::int64_t> keys(static_cast<std::size_t>(detail::key_capacity(size)));
  detail::top_n(v.data(), size, nullptr, n, vals.data(), ids.data(), keys.data());
  REQUIRE(std::vector<std::int32_t>(ids.begin(), ids.begin() + n) == plain_top(v, nullptr, n));
  for (std::int32_t j = 0; j < n; ++j)  // the values themselves, -0 stays -0
    REQUIRE(std::memcmp(&vals[j], &v[ids[j]], sizeof(float)) == 0);
  if (n <= allowed_count) {
    detail::top_n(v.data(), size, allowed.data(), n, nullptr, ids.data(), keys.data());
    REQUIRE(std::vector<std::int32_t>(ids.begin(), ids.begin() + n) ==
            plain_top(v, allowed.data(), n));
  }
}
}  // namespace

TEST_CASE("cpu selection equals a stable sort, ties and infinities included", "[cpu][math]") {
  std::mt19937 rng(5);
  const float specials[] = {
      -std::numeric_limits<float>::infinity(), -FLT_MAX, FLT_MAX, 0.0f, -0.0f, 1.0f, 1.0f, 0.5f};
  std::int64_t cases = 0;
  std::vector<std::int32_t> sizes(70);
  std::iota(sizes.begin(), sizes.end(), 1);
  sizes.insert(sizes.end(), {127, 256, 300});  // many key vectors, both chains, a tail
  for (const std::int32_t size : sizes)
    for (int rep = 0; rep < 12; ++rep) {
      std::vector<float> v(static_cast<std::size_t>(size));
      for (auto& x : v)
        x = rng() % 3 == 0 ? specials[rng() % 8] : static_cast<float>(rng() % 7) * 0.25f;
      std::vector<std::uint8_t> allowed(v.size());
      for (auto& a : allowed) a = rng() % 4 != 0;
      const std::int32_t allowed_count =
          static_cast<std::int32_t>(std::count(allowed.begin(), allowed.end(), 1));
      for (std::int32_t n = 1; n <= std::min(size, 20); ++n) {
        INFO("size " << size << " n " << n << " rep " << rep);
        check_top_n(v, allowed, allowed_count, n);
        ++cases;
      }
    }
  CHECK(cases > 10000);
}

TEST_CASE("cpu selection by threshold equals a stable sort on distinct and near-tied values",
          "[cpu][math]") {
  // Continuous values (few ties) take the threshold path's ranking by counting; rows with a
  // few exact ties, all-equal runs and masks that leave fewer than 16 lanes of a chunk take
  // its fallbacks. Sizes cross the 16-lane chunks and tails.
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::int64_t cases = 0;
  for (const std::int32_t size : {32, 33, 47, 64, 100, 128, 160, 256, 300, 1030})
    for (int rep = 0; rep < 40; ++rep) {
      std::vector<float> v(static_cast<std::size_t>(size));
      for (auto& x : v) x = normal(rng);
      if (rep % 4 == 1)  // a few exact ties among the largest
        for (int j = 0; j < 3; ++j) v[rng() % v.size()] = *std::max_element(v.begin(), v.end());
      if (rep % 4 == 2)  // -0 and +0 on top
        for (std::size_t j = 0; j < v.size(); ++j)
          v[j] = j % 7 == 0 ? (j % 2 ? -0.0f : 0.0f) : -std::abs(v[j]) - 1.0f;
      std::vector<std::uint8_t> allowed(v.size());
      for (std::size_t j = 0; j < allowed.size(); ++j)  // whole groups of 8 out, or scattered
        allowed[j] = rep % 2 == 0 ? (j / 8) % 3 != 0 : rng() % 3 != 0;
      const auto allowed_count =
          static_cast<std::int32_t>(std::count(allowed.begin(), allowed.end(), 1));
      for (std::int32_t n = 1; n <= 16; ++n) {
        INFO("size " << size << " n " << n << " rep " << rep);
        check_top_n(v, allowed, allowed_count, n);
        ++cases;
      }
    }
  CHECK(cases == 10 * 40 * 16);
}

#if defined(MOEROUTE_CPU_SELECT_COLUMNS)
TEST_CASE("cpu selection by columns equals a stable sort per row", "[cpu][math]") {
  // 1 .. 16 rows of 16 .. 256 values (all row counts: the unused lanes repeat row 0), every n
  // up to 8, rows of continuous values, of small integers (ties everywhere), and of -0, +0,
  // +-inf and +-1; masks on some rows, none on others
  std::mt19937 rng(23);
  std::normal_distribution<float> normal;
  const float specials[] = {
      -0.0f, 0.0f, -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::infinity(),
      1.0f,  -1.0f};
  std::int64_t rows_checked = 0;
  for (const std::int32_t size : {16, 32, 64, 128, 256})
    for (std::int32_t count = 1; count <= detail::column_rows; ++count)
      for (int kind = 0; kind < 3; ++kind) {
        std::vector<float> v(static_cast<std::size_t>(count * size));
        for (auto& x : v)
          x = kind == 0   ? normal(rng)
              : kind == 1 ? static_cast<float>(rng() % 5) - 2.0f
                          : specials[rng() % 6];
        std::vector<std::uint8_t> allowed(v.size());
        for (auto& a : allowed) a = rng() % 3 != 0;
        for (std::int32_t r = 0; r < count; ++r)  // at least 8 allowed per row
          std::fill_n(allowed.begin() + r * size, 8, std::uint8_t{1});
        const float* rows[detail::column_rows];
        const std::uint8_t* masks[detail::column_rows];
        for (std::int32_t r = 0; r < count; ++r) {
          rows[r] = v.data() + r * size;
          masks[r] = r % 3 == 1 ? allowed.data() + r * size : nullptr;
        }
        for (std::int32_t n = 1; n <= detail::column_places; ++n) {
          std::vector<std::int32_t> ids(static_cast<std::size_t>(count * n), -1);
          detail::top_n_columns(rows, masks, count, size, n, ids.data());
          for (std::int32_t r = 0; r < count; ++r) {
            INFO("size " << size << " rows " << count << " kind " << kind << " n " << n << " row "
                         << r);
            const std::vector<float> row(rows[r], rows[r] + size);
            REQUIRE(std::vector<std::int32_t>(ids.begin() + r * n, ids.begin() + (r + 1) * n) ==
                    plain_top(row, masks[r], n));
            ++rows_checked;
          }
        }
      }
  CHECK(rows_checked == 5 * 136 * 3 * 8);
}
#endif

TEST_CASE("cpu group mask of top-1 / top-2 group scores equals the plain definition",
          "[cpu][math]") {
  // group_mask's register path (groups 16 or 32 wide, scored by their best one or two values)
  // against sort-and-add: ties between groups (to the lower group), equal values within a
  // group (the top two may be one value twice), -0 / +0, -FLT_MAX.
  std::mt19937 rng(21);
  std::normal_distribution<float> normal;
  std::int64_t cases = 0;
  for (const std::int32_t per : {16, 32, 48})
    for (const std::int32_t G : {2, 4, 8, 16})
      for (const moeroute::group_score score :
           {moeroute::group_score::sum_top_n, moeroute::group_score::max})
        for (int rep = 0; rep < 30; ++rep) {
          const std::int32_t E = per * G;
          moeroute::routing_config cfg;
          cfg.num_experts = E;
          cfg.gating.group_limit.groups = G;
          cfg.gating.group_limit.group_topk = 1 + static_cast<std::int32_t>(rng() % G);
          cfg.gating.group_limit.score = score;
          cfg.gating.group_limit.top_n = score == moeroute::group_score::sum_top_n ? 2 : 0;
          std::vector<float> v(static_cast<std::size_t>(E));
          for (auto& x : v)
            x = rep % 3 == 0   ? static_cast<float>(rng() % 4) * 0.5f  // many ties
                : rep % 3 == 1 ? (rng() % 5 == 0 ? (rng() % 2 ? -0.0f : 0.0f) : -FLT_MAX)
                               : normal(rng);
          std::vector<float> scratch(static_cast<std::size_t>(E));
          std::vector<std::int32_t> ids(static_cast<std::size_t>(E));
          std::vector<std::int64_t> keys(static_cast<std::size_t>(detail::key_capacity(E)));
          std::vector<std::uint8_t> allowed(static_cast<std::size_t>(E), 7);
          detail::group_mask(cfg, v.data(), E, G, scratch.data(), ids.data(), keys.data(),
                             allowed.data());
          std::vector<float> gs(static_cast<std::size_t>(G));
          for (std::int32_t g = 0; g < G; ++g) {
            std::vector<float> w(v.begin() + g * per, v.begin() + (g + 1) * per);
            std::sort(w.begin(), w.end(), std::greater<>());
            double s = w[0];
            if (score == moeroute::group_score::sum_top_n) s += w[1];
            gs[static_cast<std::size_t>(g)] = static_cast<float>(s);
          }
          std::vector<std::int32_t> want_kept;
          for (std::int32_t g = 0; g < G; ++g) {
            std::int32_t better = 0;
            for (std::int32_t h = 0; h < G; ++h)
              better += gs[h] > gs[g] || (gs[h] == gs[g] && h < g) ? 1 : 0;
            const std::uint8_t want = better < cfg.gating.group_limit.group_topk ? 1 : 0;
            if (want != 0) want_kept.push_back(g);
            INFO("per " << per << " G " << G << " rep " << rep << " group " << g);
            for (std::int32_t e = g * per; e < (g + 1) * per; ++e) REQUIRE(allowed[e] == want);
          }
          // the kept groups (G = 8: all groups folded at once on AVX-512), and gathered side by
          // side they select as the masked row does
          if (detail::group_limit_by_top2(cfg, E, G)) {
            std::int32_t kept[16];
            const std::int32_t count = detail::group_kept_top2(cfg, v.data(), G, per, kept);
            REQUIRE(count == cfg.gating.group_limit.group_topk);
            REQUIRE(std::vector<std::int32_t>(kept, kept + count) == want_kept);
            std::vector<float> gathered(static_cast<std::size_t>(count * per));
            detail::gather_groups(v.data(), per, kept, count, gathered.data());
            const std::int32_t n = std::min(8, count * per);
            detail::top_n(gathered.data(), count * per, nullptr, n, nullptr, ids.data(),
                          keys.data());
            detail::ungather_ids(per, kept, n, ids.data());
            REQUIRE(std::vector<std::int32_t>(ids.begin(), ids.begin() + n) ==
                    plain_top(v, allowed.data(), n));
          }
          ++cases;
        }
  CHECK(cases == 3 * 4 * 2 * 30);
}

#if defined(MOEROUTE_CPU_SELECT_AVX512)
TEST_CASE("cpu selection of four rows side by side equals a stable sort per row", "[cpu][math]") {
  // top_n_rows_by_threshold: continuous rows (the ranking), rows with exact ties and -0 / +0
  // on top, and rows of few distinct values (more than 16 pass: ok false, ids untouched)
  std::mt19937 rng(29);
  std::normal_distribution<float> normal;
  std::int64_t ranked = 0, fallen_back = 0;
  for (const std::int32_t size : {32, 64, 128, 256, 1024})
    for (int rep = 0; rep < 30; ++rep)
      for (std::int32_t n = 3; n <= 16; ++n) {
        std::vector<float> v(static_cast<std::size_t>(4 * size));
        for (std::size_t j = 0; j < v.size(); ++j) {
          const auto r = static_cast<int>(j / static_cast<std::size_t>(size));
          v[j] = (rep + r) % 3 == 0   ? normal(rng)
                 : (rep + r) % 3 == 1 ? static_cast<float>(rng() % 4) - 2.0f
                                      : (rng() % 9 == 0 ? (rng() % 2 ? -0.0f : 0.0f)
                                                        : -std::abs(normal(rng)) - 1.0f);
        }
        const float* rows[4];
        std::int32_t* out[4];
        std::vector<std::int32_t> ids(static_cast<std::size_t>(4 * n), -7);
        for (std::int32_t r = 0; r < 4; ++r) {
          rows[r] = v.data() + r * size;
          out[r] = ids.data() + r * n;
        }
        bool ok[4];
        const std::uint8_t* const unmasked[4] = {};
        detail::top_n_rows_by_threshold<4>(rows, unmasked, size, n, out, ok);
        for (std::int32_t r = 0; r < 4; ++r) {
          INFO("size " << size << " rep " << rep << " n " << n << " row " << r);
          const std::vector<float> row(rows[r], rows[r] + size);
          const std::vector<std::int32_t> got(out[r], out[r] + n);
          if (ok[r]) {
            REQUIRE(got == plain_top(row, nullptr, n));
            ++ranked;
          } else {
            REQUIRE(got == std::vector<std::int32_t>(static_cast<std::size_t>(n), -7));
            ++fallen_back;
          }
        }
      }
  CHECK(ranked > 3000);
  CHECK(fallen_back > 1000);
}
#endif

namespace {
/// rows::load_lanes / store_lanes of L columns against dtype's to_float / to_bf16.
template <int L>
void check_bf16_lanes() {
  using vec = typename rows::row_vec<L>::f;
  INFO("columns " << L);
  // load: every bf16 bit pattern widens to to_float's float
  for (std::uint32_t hi = 0; hi < 65536; hi += L) {
    moeroute::bf16_bits in[L];
    for (std::uint32_t l = 0; l < L; ++l) in[l].bits = static_cast<std::uint16_t>(hi + l);
    vec v;
    rows::load_lanes<L>(in, v);
    for (std::uint32_t l = 0; l < L; ++l) {
      const float want = moeroute::to_float(in[l]);
      INFO("bf16 bits " << hi + l);
      REQUIRE(std::bit_cast<std::uint32_t>(v[l]) == std::bit_cast<std::uint32_t>(want));
    }
  }
  // store: registers of floats around every bf16 value (the rounding boundary 0x8000, its
  // neighbours, NaN payloads, infinities, overflow to inf) against dtype's to_bf16; every
  // fourth register mixes in subnormals and zeros (the AVX512-BF16 path's fallback), the
  // others hold none
  const std::uint32_t lows[] = {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu};
  std::mt19937 rng(11);
  std::int64_t checked = 0, subnormal_registers = 0;
  for (std::uint32_t hi = 0; hi < 65536; ++hi)
    for (const std::uint32_t lo : lows) {
      const std::uint32_t u = hi << 16 | lo;
      vec v;
      const bool mixed = (hi + lo) % 4 == 0;
      for (std::int32_t l = 0; l < L; ++l) {
        std::uint32_t b =
            (u + static_cast<std::uint32_t>(l) * 0x10001u * static_cast<std::uint32_t>(rng() % 3)) ^
            (l % 2 == 1 ? 0x80000000u : 0u);
        if (mixed && l % 5 == 2)
          b = static_cast<std::uint32_t>(rng() % 0x00800000u) | (l % 2 == 0 ? 0x80000000u : 0u);
        v[l] = std::bit_cast<float>(b);
      }
      subnormal_registers += mixed ? 1 : 0;
      moeroute::bf16_bits out[L];
      rows::store_lanes<L>(v, out);
      for (std::int32_t l = 0; l < L; ++l) {
        const std::uint32_t b = std::bit_cast<std::uint32_t>(v[l]);
        INFO("float bits " << b);
        REQUIRE(out[l].bits == moeroute::to_bf16(v[l]).bits);
        ++checked;
      }
    }
  CHECK(checked == 65536 * 6 * L);
  CHECK(subnormal_registers > 90000);
}
}  // namespace

TEST_CASE("cpu row kernels' bf16 load and store equal the scalar conversions", "[cpu][math]") {
  // the ISA's register, which the kernels take (16 columns: the AVX-512 instructions where
  // built for them)
  check_bf16_lanes<rows::lanes>();
}

TEST_CASE("cpu row copy moves exactly the bytes asked for, at any size and alignment",
          "[cpu][math]") {
  // rows::copy_bytes (permute's row copy): every size 0 .. 700 (the 256-byte steps, the
  // 64-byte ones and the libc tail) from and to every offset within a cache line, with and
  // without a row to prefetch; the bytes around the destination stay as they were
  std::vector<unsigned char> src(1024), dst(1024), want(1024);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 3);
  std::int64_t copies = 0;
  for (std::size_t bytes = 0; bytes <= 700; ++bytes)
    for (std::size_t from = 0; from < 64; from += 13)
      for (std::size_t to = 0; to < 64; to += 17)
        for (const bool next : {false, true}) {
          std::fill(dst.begin(), dst.end(), static_cast<unsigned char>(0xA5));
          want = dst;
          std::copy_n(src.begin() + static_cast<std::ptrdiff_t>(from), bytes,
                      want.begin() + static_cast<std::ptrdiff_t>(to));
          rows::copy_bytes(dst.data() + to, src.data() + from, bytes,
                           next ? src.data() + 64 : nullptr);
          INFO("bytes " << bytes << " from " << from << " to " << to);
          REQUIRE(dst == want);
          ++copies;
        }
  CHECK(copies == 701 * 5 * 4 * 2);
}
