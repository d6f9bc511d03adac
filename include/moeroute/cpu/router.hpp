// SPDX-License-Identifier: Apache-2.0
// The owning router of one MoE layer on the CPU backend: it holds every buffer the stages write
// for up to `max_tokens` tokens of `hidden` columns (one block, laid out by router_buffers from
// moeroute/shapes.hpp, allocated once through the Allocator parameter, as cuCollections'
// containers own their storage over a non-owning API) and runs the params API underneath —
// gating, dispatch, layout and the losses in one route(), then permute / combine and their
// backward passes. Results are views into the router, valid until the next call that writes
// them. Construction throws moeroute::error on a bad config or size (the owning layer may
// throw); the calls return a status, as the params API does, and allocate nothing (but the
// message of a failed status).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <moeroute/config.hpp>
#include <moeroute/cpu/combine.hpp>
#include <moeroute/cpu/combine_backward.hpp>
#include <moeroute/cpu/dispatch.hpp>
#include <moeroute/cpu/gating.hpp>
#include <moeroute/cpu/gating_backward.hpp>
#include <moeroute/cpu/layout.hpp>
#include <moeroute/cpu/losses.hpp>
#include <moeroute/cpu/parallel.hpp>
#include <moeroute/cpu/permute.hpp>
#include <moeroute/cpu/permute_backward.hpp>
#include <moeroute/router_buffers.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute::cpu {

using moeroute::router_losses;
using moeroute::router_options;

/// @brief One MoE layer's routing on the CPU backend, owning its buffers.
/// @tparam Element  the hidden states' type: float, half_bits or bf16_bits (logits may be any
///                  of the three, per call)
/// @tparam Allocator allocates the one block of bytes the router owns (an engine's pool)
template <class Element = float, class Allocator = std::allocator<std::byte>>
class router : public router_core {
  static_assert(is_element_v<Element>, "Element must be float, half_bits or bf16_bits");

 public:
  /// @brief Sizes and allocates every buffer for batches of up to `max_tokens` tokens of
  ///        `hidden` columns. @throws moeroute::error naming the bad argument.
  router(const routing_config& cfg, std::int64_t max_tokens, std::int64_t hidden,
         const router_options& options = {}, const Allocator& alloc = Allocator())
      : router_core(cfg, max_tokens, hidden, sizeof(Element), options, workspace_bytes),
        block_(b_.bytes(), alloc) {
    b_.attach(block_.get());
    std::fill_n(b_.ptr<double>("losses"), 3, 0.0);  // read as 0 where losses are not computed
  }

  /// @brief Gating, dispatch, layout and losses of `logits` [T, E] (T <= max_tokens).
  /// @tparam Logits a contiguous range of float, half_bits or bf16_bits (a std::vector, a span)
  /// @param bias  [E] the expert bias (required iff gating.expert_bias)
  /// @param valid [T] 1 = real token, 0 = padding (empty: all valid)
  /// @return success, or the first failing stage's status (naming the field)
  template <std::ranges::contiguous_range Logits>
  [[nodiscard]] status route(const Logits& logits_range, std::span<const float> bias = {},
                             std::span<const std::uint8_t> valid = {}, const executor& ex = {}) {
    return route(logits_range, gating_replay{}, bias, valid, ex);
  }

  /// @brief route() with routing replay (docs/replay.md): replay.d_ids [T, k] (host, -1 = the
  ///        router chooses) forces each slot's expert, the gates recomputed from `logits`;
  ///        replay.min_score_ratio, d_replaced as in gating_replay.
  template <std::ranges::contiguous_range Logits>
  [[nodiscard]] status route(const Logits& logits_range, const gating_replay& replay,
                             std::span<const float> bias = {},
                             std::span<const std::uint8_t> valid = {}, const executor& ex = {}) {
    using Logit = std::remove_cv_t<std::ranges::range_value_t<Logits>>;
    const std::span<const Logit> logits(std::ranges::data(logits_range),
                                        std::ranges::size(logits_range));
    const routing_config& cfg = b_.config();
    const std::int64_t E = cfg.num_experts;
    if (logits.size() % static_cast<std::size_t>(E) != 0)
      return status::make(status_code::invalid_shape,
                          "router::route: logits has " + std::to_string(logits.size()) +
                              " elements, not a multiple of E = " + std::to_string(E));
    const std::int64_t T = static_cast<std::int64_t>(logits.size()) / E;
    if (auto s = b_.check_tokens("route", T); !s) return s;
    if (!valid.empty() && static_cast<std::int64_t>(valid.size()) != T)
      return status::make(status_code::invalid_shape,
                          "router::route: valid has " + std::to_string(valid.size()) +
                              " elements, expected T = " + std::to_string(T));
    begin_batch(T);
    gating_params<Logit> g;
    g.d_logits = logits.data();
    g.tokens = T;
    g.d_bias = bias.empty() ? nullptr : bias.data();
    g.d_valid = valid.empty() ? nullptr : valid.data();
    g.out = b_.gating_out();
    g.replay = replay;
    const auto ws = b_.get<std::byte>("workspace");
    if (auto s = cpu::gating(cfg, g, ws.data(), ws.size(), ex); !s) return s;
    dispatch_params d;
    d.tokens = T;
    d.gated = g.out;
    d.d_valid = g.d_valid;
    d.out = b_.dispatch_out();
    if (auto s = cpu::dispatch(cfg, d, ws.data(), ws.size(), ex); !s) return s;
    if (auto s = cpu::layout(cfg, b_.layout_params_for(T, d.out), ex); !s) return s;
    if (b_.options().losses)  // (the inference path computes none)
      if (auto s = cpu::losses(cfg, b_.loss_params_for(T), ex); !s) return s;
    routed_ = true;
    return status::success();
  }

  /// @brief expert_in[row] = x[row_token[row]] for the routed batch: the experts' input rows,
  ///        [rows(), hidden] (expert e's segment is rows [offsets()[e], offsets()[e + 1])).
  /// @param x [T, hidden] the layer's input; @param out the view written
  [[nodiscard]] status permute(std::span<const Element> x, std::span<Element>& out,
                               const executor& ex = {}) {
    if (auto s = check_rows("permute", "x", x.size(), tokens_); !s) return s;
    const permute_params<Element> p{x.data(), tokens_, b_.hidden(),
                                    layout(), rows(),  b_.ptr<Element>("expert_in")};
    if (auto s = cpu::permute(b_.config(), p, ex); !s) return s;
    out = rows_of("expert_in", rows());
    return status::success();
  }

  /// @brief y[t] = sum_j weight[t, j] * expert_out[row(t, j)] (fp32, choice order); with
  ///        drop_policy::residual a valid token with nothing kept gets x[t].
  /// @param expert_out [rows(), hidden]; @param x [T, hidden] (residual policy; may be empty
  ///        otherwise); @param y the view written, [T, hidden]
  [[nodiscard]] status combine(std::span<const Element> expert_out, std::span<const Element> x,
                               std::span<Element>& y, const executor& ex = {}) {
    if (auto s = check_rows("combine", "expert_out", expert_out.size(), rows()); !s) return s;
    if (b_.residual())
      if (auto s = check_rows("combine", "x", x.size(), tokens_); !s) return s;
    const combine_params<Element> p{
        expert_out.data(), rows(),       tokens_,  b_.hidden(),
        layout(),          dispatched(), x.data(), b_.ptr<Element>("y")};
    if (auto s = cpu::combine(b_.config(), p, ex); !s) return s;
    y = rows_of("y", tokens_);
    return status::success();
  }

  /// @brief The backward of combine: d expert_out [rows(), hidden] (the view written) and the
  ///        combine weights' gradient (kept for gating_backward); the residual pass-through's
  ///        d x is added by permute_backward.
  [[nodiscard]] status combine_backward(std::span<const Element> dy,
                                        std::span<const Element> expert_out,
                                        std::span<Element>& grad_expert_out,
                                        const executor& ex = {}) {
    if (auto s = check_rows("combine_backward", "dy", dy.size(), tokens_); !s) return s;
    if (auto s = check_rows("combine_backward", "expert_out", expert_out.size(), rows()); !s)
      return s;
    combine_backward_params<Element> p;
    p.d_expert_out = expert_out.data();
    p.d_dy = dy.data();
    p.rows = rows();
    p.tokens = tokens_;
    p.hidden = b_.hidden();
    p.layout = layout();
    p.dispatched = dispatched();
    p.d_grad_expert_out = b_.ptr<Element>("grad_expert_out");
    p.d_grad_weight = b_.ptr<float>("grad_weight");
    p.d_grad_x = b_.residual() ? b_.ptr<Element>("grad_x") : nullptr;
    if (auto s = cpu::combine_backward(b_.config(), p, ex); !s) return s;
    residual_grad_ = b_.residual();
    weight_grad_ = true;
    grad_expert_out = rows_of("grad_expert_out", rows());
    return status::success();
  }

  /// @brief The backward of permute: d x [T, hidden] (the view written) = the sum of each
  ///        token's row gradients, plus combine_backward's residual pass-through.
  [[nodiscard]] status permute_backward(std::span<const Element> grad_expert_in,
                                        std::span<Element>& grad_x, const executor& ex = {}) {
    if (auto s = check_rows("permute_backward", "grad_expert_in", grad_expert_in.size(), rows());
        !s)
      return s;
    permute_backward_params<Element> p;
    p.d_grad_buf = grad_expert_in.data();
    p.rows = rows();
    p.tokens = tokens_;
    p.hidden = b_.hidden();
    p.layout = layout();
    p.accumulate = residual_grad_;
    p.d_grad_x = b_.ptr<Element>("grad_x");
    if (auto s = cpu::permute_backward(b_.config(), p, ex); !s) return s;
    residual_grad_ = false;
    grad_x = rows_of("grad_x", tokens_);
    return status::success();
  }

  /// @brief d logits [T, E] f32 (the view written) of the routing term (through
  ///        combine_backward's weight gradient, when it ran since route()) and the losses.
  /// @param logits the forward's logits; @param weights dL/d(each loss) (default 1)
  template <std::ranges::contiguous_range Logits>
  [[nodiscard]] status gating_backward(const Logits& logits_range, std::span<float>& grad_logits,
                                       const gating_backward_weights& weights = {},
                                       const executor& ex = {}) {
    using Logit = std::remove_cv_t<std::ranges::range_value_t<Logits>>;
    const std::span<const Logit> logits(std::ranges::data(logits_range),
                                        std::ranges::size(logits_range));
    const std::int64_t E = b_.config().num_experts;
    if (auto s = check_losses_kept("gating_backward"); !s) return s;
    if (auto s = check_rows("gating_backward", "logits", logits.size(), tokens_, E); !s) return s;
    gating_backward_params<Logit> p;
    p.d_logits = logits.data();
    p.tokens = tokens_;
    p.gated = gated();
    p.dispatched = dispatched();
    p.d_grad_weight = weight_grad_ ? b_.ptr<float>("grad_weight") : nullptr;
    p.weights = weights;
    p.accumulate = false;
    p.d_grad_logits = b_.ptr<float>("grad_logits");
    if (auto s = cpu::gating_backward(b_.config(), p, ex); !s) return s;
    grad_logits = b_.get<float>("grad_logits").first(static_cast<std::size_t>(tokens_ * E));
    return status::success();
  }

  // ---- the routed batch's results (valid after a successful route()); the rest: router_core
  [[nodiscard]] const dispatch_totals& totals() const noexcept {
    return *b_.ptr<dispatch_totals>("totals");
  }
  [[nodiscard]] router_losses losses() const noexcept {
    const double* l = b_.ptr<double>("losses");
    return {l[0], l[1], l[2]};
  }
  /// [ET + 1] the first row of each expert's segment in the expert buffer.
  [[nodiscard]] std::span<const std::int64_t> offsets() const noexcept {
    return b_.get<std::int64_t>("offsets").first(
        static_cast<std::size_t>(b_.config().total_experts()) + 1);
  }

 private:
  /// What gating and dispatch need, the one workspace of both (they run one after the other).
  static std::size_t workspace_bytes(const routing_config& cfg, std::int64_t tokens) {
    return std::max(gating_workspace_bytes(cfg, tokens), dispatch_workspace_bytes(cfg, tokens));
  }
  /// `rows` rows of the hidden-state buffer `name`.
  [[nodiscard]] std::span<Element> rows_of(std::string_view name, std::int64_t rows) const {
    return b_.get<Element>(name).first(static_cast<std::size_t>(rows * b_.hidden()));
  }
  /// A view of `per_row` x `rows` elements (per_row: hidden by default) must be that long.
  [[nodiscard]] status check_rows(const char* op, const char* name, std::size_t got,
                                  std::int64_t rows, std::int64_t per_row = -1) const {
    if (auto s = check_routed(op); !s) return s;
    const std::int64_t want = rows * (per_row < 0 ? b_.hidden() : per_row);
    if (static_cast<std::int64_t>(got) != want)
      return status::make(status_code::invalid_shape,
                          std::string("router::") + op + ": " + name + " has " +
                              std::to_string(got) + " elements, expected " + std::to_string(want));
    return status::success();
  }

  owned_block<Allocator> block_;  ///< the one allocation, laid out by b_
};

}  // namespace moeroute::cpu
