// SPDX-License-Identifier: Apache-2.0
// Layouts (padded and compact with a block size), permute, combine (every drop policy,
// including residual and fallback / next_choice reroutes) and the routing statistics.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <moeroute/reference.hpp>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "../common/invariants.hpp"
#include "../common/test_util.hpp"

using namespace moeroute;
using Catch::Matchers::WithinRel;
using moeroute::test::dist;

namespace {

/// "" when the layout is consistent with the dispatch, else the first problem.
std::string layout_violation(const reference::dispatch_output& d, const reference::layout_output& L,
                             bool padded, std::int64_t block) {
  const std::int32_t ET = d.total_experts;
  if (static_cast<std::int32_t>(L.offsets.size()) != ET + 1) return "offsets size";
  if (L.offsets[0] != 0 || L.offsets[ET] != L.num_rows) return "offsets ends";
  for (std::int32_t e = 0; e < ET; ++e) {
    const std::int64_t seg = L.offsets[e + 1] - L.offsets[e];
    if (seg < d.load[e]) return "segment smaller than load at expert " + std::to_string(e);
    if (padded && e < d.experts && seg != d.capacity)
      return "padded segment != C at expert " + std::to_string(e);
    if (!padded) {
      if (L.offsets[e] % block != 0) return "compact offset not block aligned";
      if (seg != (d.load[e] + block - 1) / block * block)
        return "compact segment not round_up(load)";
    }
    if (L.rows_used[e] != d.load[e]) return "rows_used";
  }
  if (static_cast<std::int64_t>(L.row_token.size()) != L.num_rows) return "row_token size";
  std::int64_t used = 0;
  for (std::int64_t r = 0; r < L.num_rows; ++r) used += L.row_token[r] >= 0;
  if (used != L.num_rows - L.padding_rows()) return "padding_rows";
  for (std::int64_t a = 0; a < d.tokens * d.k; ++a) {
    const std::int64_t row = L.assignment_row[a];
    if (d.expert[a] < 0) {
      if (row != -1) return "unrouted assignment has a row";
      continue;
    }
    if (row != L.offsets[d.expert[a]] + d.slot[a]) return "row != offsets[e] + slot";
    if (L.row_token[row] != a / d.k) return "row_token[assignment_row] != token";
  }
  // every used row is some assignment's row
  std::set<std::int64_t> rows;
  for (auto r : L.assignment_row)
    if (r >= 0) rows.insert(r);
  if (static_cast<std::int64_t>(rows.size()) != used) return "a used row no assignment points at";
  if (!padded) {
    if (static_cast<std::int64_t>(L.block_expert.size()) != L.num_rows / block)
      return "block_expert size";
    for (std::int64_t b = 0; b < L.num_rows / block; ++b) {
      const std::int32_t e = L.block_expert[b];
      if (b * block < L.offsets[e] || b * block >= L.offsets[e + 1]) return "block_expert wrong";
    }
  }
  return "";
}

const drop_policy all_drop_policies[] = {drop_policy::zero_weight, drop_policy::residual,
                                         drop_policy::fallback, drop_policy::next_choice};

}  // namespace

TEST_CASE("layouts: padded and compact are consistent with the dispatch", "[reference][layout]") {
  for (drop_policy pol : all_drop_policies)
    for (std::int32_t fb : {-1, 2})
      for (priority p : {priority::token_major, priority::choice_major, priority::score_per_expert,
                         priority::random})
        for (dist dd : {dist::normal, dist::collapsed, dist::ties})
          for (double f : {0.3, 1.0, 3.0}) {
            routing_config c;
            c.num_experts = 7;
            c.top_k = 2;
            c.capacity.factor = f;
            c.dispatch.prio = p;
            c.dispatch.dropped = pol;
            c.dispatch.fallback = {fb, fb < 0 ? 5 : -1};
            const std::int64_t T = 50;
            const auto x = test::make_logits(T, 7, dd, 12u);
            const auto r = reference::route<float>(c, x, T);
            INFO("policy " << static_cast<int>(pol) << " fb " << fb << " prio "
                           << static_cast<int>(p) << " dist " << test::name(dd) << " factor " << f);
            REQUIRE(test::dispatch_violation(c, r.gating, r.dispatch) == "");
            const auto P = reference::layout(c, r.dispatch, layout_kind::padded);
            CHECK(layout_violation(r.dispatch, P, true, 1) == "");
            CHECK(P.num_rows == 7 * r.dispatch.capacity + (c.has_dedicated_fallback() ? 5 : 0));
            for (std::int64_t bs : {1, 4, 16, 128}) {
              const auto L = reference::layout(c, r.dispatch, layout_kind::compact, bs);
              INFO("block " << bs);
              CHECK(layout_violation(r.dispatch, L, false, bs) == "");
              CHECK(L.block_size == bs);
            }
          }
}

TEST_CASE("layouts: compact offsets by hand (moe_align_block_size)", "[reference][layout]") {
  // loads (3, 0, 5) with block 4 -> segments (4, 0, 8), offsets (0, 4, 4, 12)
  routing_config c;
  c.num_experts = 3;
  c.top_k = 1;
  c.capacity.mode = capacity_mode::unbounded;
  const std::vector<float> x = {1, 0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0,
                                0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1};
  const auto r = reference::route<float>(c, x, 8);
  REQUIRE(r.dispatch.load == std::vector<std::int64_t>{3, 0, 5});
  const auto L = reference::layout(c, r.dispatch, layout_kind::compact, 4);
  CHECK(L.offsets == std::vector<std::int64_t>{0, 4, 4, 12});
  CHECK(L.num_rows == 12);
  CHECK(L.block_expert == std::vector<std::int32_t>{0, 2, 2});
  CHECK(L.row_token == std::vector<std::int32_t>{0, 1, 3, -1, 2, 4, 5, 6, 7, -1, -1, -1});
  CHECK(L.padding_rows() == 4);
  const auto st = reference::compute_stats(r.dispatch, L);
  CHECK(st.padding_waste == 4.0 / 12.0);
  CHECK(st.dead_experts == 1);
  CHECK(st.max_load == 5);
  CHECK(st.mean_load == 8.0 / 3.0);
  CHECK_THROWS(reference::layout(c, r.dispatch, layout_kind::padded));  // unbounded
}

TEST_CASE("permute and combine: every drop policy, both layouts, exact expert rows",
          "[reference][combine]") {
  const std::int64_t T = 40, dm = 5;
  const std::int32_t E = 6, k = 2;
  std::vector<float> x(T * dm);
  for (std::int64_t i = 0; i < T * dm; ++i) x[i] = static_cast<float>((i * 37) % 11) - 5.0f;
  const auto logits = test::make_logits(T, E, dist::skewed, 31u);
  for (drop_policy pol : all_drop_policies)
    for (std::int32_t fb : {-1, 5})
      for (bool compact : {false, true})
        for (renormalize rn :
             {renormalize::none, renormalize::before_drop, renormalize::after_drop}) {
          routing_config c;
          c.num_experts = E;
          c.top_k = k;
          c.gating.select = select_from::scores;
          c.gating.renorm = rn;
          c.capacity.factor = 0.5;
          c.dispatch.dropped = pol;
          c.dispatch.fallback = {fb, -1};
          c.dispatch.reroute.max_candidates = 2;
          const auto r = reference::route<float>(c, logits, T);
          const auto& d = r.dispatch;
          INFO("policy " << static_cast<int>(pol) << " fb " << fb << " compact " << compact
                         << " renorm " << static_cast<int>(rn));
          REQUIRE(test::dispatch_violation(c, r.gating, d) == "");
          if (pol == drop_policy::fallback || pol == drop_policy::next_choice)
            REQUIRE(d.total_rerouted > 0);
          REQUIRE(d.total_dropped + d.total_rerouted > 0);
          const auto L = compact ? reference::layout(c, d, layout_kind::compact, 8)
                                 : reference::layout(c, d, layout_kind::padded);
          std::vector<float> rows(L.num_rows * dm, -99.0f);
          reference::permute<float>(c, L, x, T, dm, rows);
          for (std::int64_t row = 0; row < L.num_rows; ++row)
            for (std::int64_t cc = 0; cc < dm; ++cc) {
              const std::int32_t t = L.row_token[row];
              CHECK(rows[row * dm + cc] == (t < 0 ? 0.0f : x[t * dm + cc]));
            }
          // expert e multiplies by (e + 1): the combine must pick each assignment's final expert
          std::vector<std::int32_t> row_expert(L.num_rows, -1);
          for (std::int32_t e = 0; e < d.total_experts; ++e)
            for (std::int64_t row = L.offsets[e]; row < L.offsets[e + 1]; ++row)
              row_expert[row] = e;
          std::vector<float> out(rows.size());
          for (std::int64_t row = 0; row < L.num_rows; ++row)
            for (std::int64_t cc = 0; cc < dm; ++cc)
              out[row * dm + cc] = rows[row * dm + cc] * static_cast<float>(row_expert[row] + 1);
          std::vector<float> y(T * dm, -99.0f);
          reference::combine<float>(c, L, d, out, dm, x, y);
          std::int64_t residual_tokens = 0;
          for (std::int64_t t = 0; t < T; ++t) {
            bool any = false;
            for (std::int32_t j = 0; j < k; ++j) any = any || d.expert[t * k + j] >= 0;
            const bool passthrough = pol == drop_policy::residual && !any;
            residual_tokens += passthrough;
            for (std::int64_t cc = 0; cc < dm; ++cc) {
              float want = 0.0f;  // in rank order, fp32, as documented
              for (std::int32_t j = 0; j < k; ++j) {
                const std::int64_t a = t * k + j;
                if (d.expert[a] < 0) continue;
                want += d.weight[a] * (x[t * dm + cc] * static_cast<float>(d.expert[a] + 1));
              }
              if (passthrough) want = x[t * dm + cc];
              CHECK(y[t * dm + cc] == want);
            }
          }
          if (pol == drop_policy::residual) CHECK(residual_tokens > 0);
          // weights: after-drop renormalisation makes each surviving token's weights sum to 1
          if (rn == renormalize::after_drop)
            for (std::int64_t t = 0; t < T; ++t) {
              float s = 0.0f;
              bool any = false;
              for (std::int32_t j = 0; j < k; ++j) {
                s += d.weight[t * k + j];
                any = any || d.expert[t * k + j] >= 0;
              }
              if (any) CHECK_THAT(s, WithinRel(1.0f, 1e-6f));
            }
          // stats agree with the dispatch
          const auto st = reference::compute_stats(d, L);
          CHECK(st.kept == d.total_kept);
          CHECK(st.rerouted == d.total_rerouted);
          CHECK(st.dropped == d.total_dropped);
          CHECK(st.drop_rate == static_cast<double>(d.total_dropped) / static_cast<double>(T * k));
          if (pol == drop_policy::residual) CHECK(st.fully_dropped_tokens == residual_tokens);
          CHECK(st.padding_waste ==
                static_cast<double>(L.padding_rows()) / static_cast<double>(L.num_rows));
        }
}

TEST_CASE("combine: 16-bit buffers round the fp32 accumulation once", "[reference][combine]") {
  const std::int64_t T = 8, dm = 3;
  const auto logits = test::make_logits(T, 4, dist::normal, 2u);
  auto c = presets::deepspeed_topk(4, 2, 1.0, 0);
  c.dispatch.dropped = drop_policy::residual;
  const auto r = reference::route<float>(c, logits, T);
  const auto L = reference::layout(c, r.dispatch, layout_kind::padded);
  std::vector<float> xf(T * dm), of(L.num_rows * dm), yf(T * dm);
  std::vector<bf16_bits> xb(T * dm), ob(L.num_rows * dm), yb(T * dm);
  for (std::int64_t i = 0; i < T * dm; ++i) {
    xb[i] = to_bf16(0.37f * static_cast<float>(i) - 2.0f);
    xf[i] = to_float(xb[i]);
  }
  reference::permute<bf16_bits>(c, L, xb, T, dm, ob);
  reference::permute<float>(c, L, xf, T, dm, of);
  for (std::size_t i = 0; i < ob.size(); ++i) CHECK(to_float(ob[i]) == of[i]);
  reference::combine<bf16_bits>(c, L, r.dispatch, ob, dm, xb, yb);
  reference::combine<float>(c, L, r.dispatch, of, dm, xf, yf);
  for (std::size_t i = 0; i < yb.size(); ++i) CHECK(yb[i].bits == to_bf16(yf[i]).bits);
}

TEST_CASE("combine: padding tokens get zeros, not the residual", "[reference][combine]") {
  const std::int64_t T = 4, dm = 2;
  routing_config c;
  c.num_experts = 2;
  c.top_k = 1;
  c.capacity.mode = capacity_mode::fixed;
  c.capacity.fixed = 1;
  c.dispatch.dropped = drop_policy::residual;
  const std::vector<float> logits = {1, 0, 1, 0, 1, 0, 1, 0};
  const std::vector<std::uint8_t> valid = {1, 0, 1, 1};
  const auto r = reference::route<float>(c, logits, T, {}, valid);
  CHECK(r.dispatch.fates ==
        std::vector<fate>{fate::kept, fate::masked, fate::dropped, fate::dropped});
  const auto L = reference::layout(c, r.dispatch, layout_kind::padded);
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<float> rows(L.num_rows * dm), y(T * dm);
  reference::permute<float>(c, L, x, T, dm, rows);
  reference::combine<float>(c, L, r.dispatch, rows, dm, x, y);
  const float w = r.dispatch.weight[0];
  CHECK(y == std::vector<float>{w * 1, w * 2, 0, 0, 5, 6, 7, 8});
  const auto st = reference::compute_stats(r.dispatch, L);
  CHECK(st.masked == 1);
  CHECK(st.fully_dropped_tokens == 2);
  CHECK(st.drop_rate == 2.0 / 3.0);
  CHECK(st.padding_waste == 0.5);  // 2 experts x C = 1, one row used
}

// The argument order before 0.3 — (cfg, dispatch, layout, ...) — still compiles (deprecated)
// and gives the same values as the order of the cpu / cuda params, (cfg, layout, dispatch).
TEST_CASE("combine and the row backward passes: the old argument order still works",
          "[reference][combine]") {
  const routing_config cfg = presets::deepspeed_top2(8, 1.0);
  const std::int64_t T = 24, d = 3;
  std::vector<float> logits(T * 8);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = float((i * 37) % 11) / 4.0f;
  const auto r = reference::route<float>(cfg, logits, T);
  const auto L = reference::layout(cfg, r.dispatch, layout_kind::padded);
  std::vector<float> x(T * d), out(L.num_rows * d), dy(T * d, 0.5f);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(i % 7) - 3.0f;
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = float(i % 5) / 2.0f;
  std::vector<float> y_new(T * d), y_old(T * d), dout_new(out.size()), dout_old(out.size()),
      dw_new(T * 2), dw_old(T * 2), dx_new(T * d), dx_old(T * d);
  reference::combine<float>(cfg, L, r.dispatch, out, d, x, y_new);
  reference::combine_backward<float>(cfg, L, r.dispatch, out, d, dy, dout_new, dw_new, dx_new);
  reference::permute_backward<float>(cfg, L, r.dispatch, dout_new, d, dx_new, true);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  reference::combine<float>(cfg, r.dispatch, L, out, d, x, y_old);
  reference::combine_backward<float>(cfg, r.dispatch, L, out, d, dy, dout_old, dw_old, dx_old);
  reference::permute_backward<float>(cfg, r.dispatch, L, dout_old, d, dx_old, true);
#pragma GCC diagnostic pop
  REQUIRE(y_old == y_new);
  REQUIRE(dout_old == dout_new);
  REQUIRE(dw_old == dw_new);
  REQUIRE(dx_old == dx_new);
  REQUIRE(std::any_of(y_new.begin(), y_new.end(), [](float v) { return v != 0.0f; }));
}
