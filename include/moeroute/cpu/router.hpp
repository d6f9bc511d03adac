// SPDX-License-Identifier: Apache-2.0
// The owning router of one MoE layer on the CPU backend: it holds every buffer the stages write
// for up to `max_tokens` tokens of `hidden` columns (sized by moeroute/shapes.hpp, allocated
// once through the Allocator parameter, as cuCollections' containers own their storage over a
// non-owning API) and runs the params API underneath — gating, dispatch, layout and the losses
// in one route(), then permute / combine and their backward passes. Results are views into the
// router, valid until the next call that writes them. Construction throws moeroute::error on a
// bad config or size (the owning layer may throw); the calls return a status, as the params API
// does, and neither allocate nor throw.
#pragma once

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
#include <moeroute/shapes.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute::cpu {

/// What a router is built for, beside its config and maximum batch.
struct router_options {
  /// The expert buffer: padded [E, C] or compact. Unset: padded with a capacity, compact for a
  /// dropless config (capacity_mode::unbounded).
  std::optional<layout_kind> layout{};
  std::int64_t block_size = 1;  ///< compact: segments rounded up to this many rows
  bool logsumexp = false;       ///< keep the logsumexp [T] (always kept with a z-loss)
};

/// The losses of one route() call.
struct router_losses {
  double aux = 0.0;           ///< load-balancing loss, with its coefficient
  double sequence_aux = 0.0;  ///< per-sequence aux loss (loss.sequence_length > 0)
  double z = 0.0;             ///< router z-loss, with its coefficient
};

/// @brief One MoE layer's routing on the CPU backend, owning its buffers.
/// @tparam Element  the hidden states' type: float, half_bits or bf16_bits (logits may be any
///                  of the three, per call)
/// @tparam Allocator allocates the one block of bytes the router owns (an engine's pool)
template <class Element = float, class Allocator = std::allocator<std::byte>>
class router {
  static_assert(is_element_v<Element>, "Element must be float, half_bits or bf16_bits");

 public:
  /// @brief Sizes and allocates every buffer for batches of up to `max_tokens` tokens of
  ///        `hidden` columns. @throws moeroute::error naming the bad argument.
  router(const routing_config& cfg, std::int64_t max_tokens, std::int64_t hidden,
         const router_options& options = {}, const Allocator& alloc = Allocator())
      : cfg_(cfg), max_tokens_(max_tokens), hidden_(hidden), opt_(options), block_(alloc) {
    throw_if(validate(cfg_));
    kind_ =
        opt_.layout.value_or(cfg_.capacity.mode == capacity_mode::unbounded ? layout_kind::compact
                                                                            : layout_kind::padded);
    throw_if(validate_tokens(cfg_, max_tokens_));
    if (hidden_ < 0)
      throw_if(status::make(status_code::invalid_argument,
                            "router: hidden = " + std::to_string(hidden_) + ": must be >= 0"));
    if (kind_ == layout_kind::padded && opt_.block_size != 1)
      throw_if(status::make(status_code::invalid_argument,
                            "router: block_size = " + std::to_string(opt_.block_size) +
                                " with the padded layout (only the compact one aligns segments)"));
    throw_if(layout_rows(cfg_, max_tokens_, kind_, opt_.block_size, 0, max_rows_));
    const std::int64_t T = max_tokens_, d = hidden_, E = cfg_.num_experts, k = cfg_.top_k;
    shapes_ = gating_buffers(cfg_, T, {opt_.logsumexp || cfg_.loss.z_coefficient != 0.0f});
    for (auto& s : dispatch_buffers(cfg_, T)) shapes_.push_back(s);
    for (auto& s : layout_buffers(cfg_, T, kind_, opt_.block_size, max_rows_)) shapes_.push_back(s);
    // rows of hidden states, as bytes (Element is float, half_bits or bf16_bits)
    const std::int64_t row = d * static_cast<std::int64_t>(sizeof(Element));
    shapes_.push_back({"expert_in", buffer_type::u8, {max_rows_, row}});  // permute's output
    shapes_.push_back({"y", buffer_type::u8, {T, row}});                  // combine's output
    shapes_.push_back({"grad_expert_out", buffer_type::u8, {max_rows_, row}});
    shapes_.push_back({"grad_x", buffer_type::u8, {T, row}});
    shapes_.push_back({"grad_weight", buffer_type::f32, {T, k}});
    shapes_.push_back({"grad_logits", buffer_type::f32, {T, E}});
    shapes_.push_back({"losses", buffer_type::f64, {3}});  // aux, sequence aux, z
    shapes_.push_back({"workspace",
                       buffer_type::u8,
                       {static_cast<std::int64_t>(std::max(gating_workspace_bytes(cfg_, T),
                                                           dispatch_workspace_bytes(cfg_, T)))}});
    bytes_ = buffer_block_bytes(shapes_) + buffer_alignment;
    base_ = std::allocator_traits<Allocator>::allocate(block_, bytes_);
    auto* aligned = reinterpret_cast<std::byte*>(
        (reinterpret_cast<std::uintptr_t>(base_) + buffer_alignment - 1) / buffer_alignment *
        buffer_alignment);
    at_.resize(shapes_.size());
    carve_buffers(shapes_, aligned, at_);
  }
  router(const router&) = delete;
  router& operator=(const router&) = delete;
  ~router() {
    if (base_) std::allocator_traits<Allocator>::deallocate(block_, base_, bytes_);
  }

  /// @brief Gating, dispatch, layout and losses of `logits` [T, E] (T <= max_tokens).
  /// @param bias  [E] the expert bias (required iff gating.expert_bias)
  /// @param valid [T] 1 = real token, 0 = padding (empty: all valid)
  /// @return success, or the first failing stage's status (naming the field)
  /// @tparam Logits a contiguous range of float, half_bits or bf16_bits (a std::vector, a span)
  template <std::ranges::contiguous_range Logits>
  [[nodiscard]] status route(const Logits& logits_range, std::span<const float> bias = {},
                             std::span<const std::uint8_t> valid = {}, const executor& ex = {}) {
    using Logit = std::remove_cv_t<std::ranges::range_value_t<Logits>>;
    const std::span<const Logit> logits(std::ranges::data(logits_range),
                                        std::ranges::size(logits_range));
    const std::int64_t E = cfg_.num_experts;
    if (logits.size() % static_cast<std::size_t>(E) != 0)
      return status::make(status_code::invalid_shape,
                          "router::route: logits has " + std::to_string(logits.size()) +
                              " elements, not a multiple of E = " + std::to_string(E));
    const std::int64_t T = static_cast<std::int64_t>(logits.size()) / E;
    if (T > max_tokens_)
      return status::make(status_code::invalid_shape,
                          "router::route: " + std::to_string(T) + " tokens, the router holds " +
                              std::to_string(max_tokens_) + " (max_tokens)");
    if (!valid.empty() && static_cast<std::int64_t>(valid.size()) != T)
      return status::make(status_code::invalid_shape,
                          "router::route: valid has " + std::to_string(valid.size()) +
                              " elements, expected T = " + std::to_string(T));
    tokens_ = T;
    routed_ = false;
    weight_grad_ = false;
    residual_grad_ = false;
    gating_params<Logit> g;
    g.d_logits = logits.data();
    g.tokens = T;
    g.d_bias = bias.empty() ? nullptr : bias.data();
    g.d_valid = valid.empty() ? nullptr : valid.data();
    g.out = gating_out();
    const auto ws = buffer<std::byte>("workspace");
    if (auto s = cpu::gating(cfg_, g, ws.data(), ws.size(), ex); !s) return s;
    dispatch_params d;
    d.tokens = T;
    d.gated = g.out;
    d.d_valid = g.d_valid;
    d.out = dispatch_out();
    if (auto s = cpu::dispatch(cfg_, d, ws.data(), ws.size(), ex); !s) return s;
    layout_params l;
    l.kind = kind_;
    l.block_size = opt_.block_size;
    l.tokens = T;
    l.max_rows = rows_for(T);
    l.dispatched = d.out;
    l.out = layout_out();
    if (auto s = cpu::layout(cfg_, l, ex); !s) return s;
    loss_params lp;
    lp.tokens = T;
    lp.sums = g.out.sums;
    double* losses = buffer<double>("losses").data();
    lp.d_aux_loss = &losses[0];
    lp.d_sequence_aux_loss = cfg_.loss.sequence_length > 0 ? &losses[1] : nullptr;
    lp.d_z_loss = &losses[2];
    if (auto s = cpu::losses(cfg_, lp, ex); !s) return s;
    routed_ = true;
    return status::success();
  }

  /// @brief expert_in[row] = x[row_token[row]] for the routed batch: the experts' input rows,
  ///        [rows(), hidden] (segment e of the padded layout is rows [offsets[e], offsets[e+1])).
  /// @param x [T, hidden] the layer's input; @param out the view written
  [[nodiscard]] status permute(std::span<const Element> x, std::span<Element>& out,
                               const executor& ex = {}) {
    if (auto s = check_rows("permute", "x", x.size(), tokens_); !s) return s;
    permute_params<Element> p{x.data(),      tokens_, hidden_,
                              layout_view(), rows(),  buffer<Element>("expert_in").data()};
    if (auto s = cpu::permute(cfg_, p, ex); !s) return s;
    out = buffer<Element>("expert_in").first(static_cast<std::size_t>(rows() * hidden_));
    return status::success();
  }

  /// @brief y[t] = sum_j weight[t, j] * expert_out[row(t, j)] (fp32, choice order); with
  ///        drop_policy::residual a valid token with nothing kept gets x[t].
  /// @param expert_out [rows(), hidden]; @param x [T, hidden] (residual policy; may be empty
  ///        otherwise); @param y the view written, [T, hidden]
  [[nodiscard]] status combine(std::span<const Element> expert_out, std::span<const Element> x,
                               std::span<Element>& y, const executor& ex = {}) {
    if (auto s = check_rows("combine", "expert_out", expert_out.size(), rows()); !s) return s;
    if (residual())
      if (auto s = check_rows("combine", "x", x.size(), tokens_); !s) return s;
    combine_params<Element> p{
        expert_out.data(), rows(),          tokens_,  hidden_,
        layout_view(),     dispatch_view(), x.data(), buffer<Element>("y").data()};
    if (auto s = cpu::combine(cfg_, p, ex); !s) return s;
    y = buffer<Element>("y").first(static_cast<std::size_t>(tokens_ * hidden_));
    return status::success();
  }

  /// @brief The backward of combine: d expert_out [rows(), hidden] (the view written) and the
  ///        combine weights' gradient (kept for gating_backward); d x of the residual
  ///        pass-through is added by permute_backward.
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
    p.hidden = hidden_;
    p.layout = layout_view();
    p.dispatched = dispatch_view();
    p.d_grad_expert_out = buffer<Element>("grad_expert_out").data();
    p.d_grad_weight = buffer<float>("grad_weight").data();
    p.d_grad_x = residual() ? buffer<Element>("grad_x").data() : nullptr;
    if (auto s = cpu::combine_backward(cfg_, p, ex); !s) return s;
    residual_grad_ = residual();
    weight_grad_ = true;
    grad_expert_out =
        buffer<Element>("grad_expert_out").first(static_cast<std::size_t>(rows() * hidden_));
    return status::success();
  }

  /// @brief The backward of permute: d x [T, hidden] (the view written) = the sum of each
  ///        token's row gradients, plus the residual pass-through of combine_backward.
  [[nodiscard]] status permute_backward(std::span<const Element> grad_expert_in,
                                        std::span<Element>& grad_x, const executor& ex = {}) {
    if (auto s = check_rows("permute_backward", "grad_expert_in", grad_expert_in.size(), rows());
        !s)
      return s;
    permute_backward_params<Element> p;
    p.d_grad_buf = grad_expert_in.data();
    p.rows = rows();
    p.tokens = tokens_;
    p.hidden = hidden_;
    p.layout = layout_view();
    p.accumulate = residual_grad_;
    p.d_grad_x = buffer<Element>("grad_x").data();
    if (auto s = cpu::permute_backward(cfg_, p, ex); !s) return s;
    residual_grad_ = false;
    grad_x = buffer<Element>("grad_x").first(static_cast<std::size_t>(tokens_ * hidden_));
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
    if (auto s = check_rows("gating_backward", "logits", logits.size(), tokens_, cfg_.num_experts);
        !s)
      return s;
    gating_backward_params<Logit> p;
    p.d_logits = logits.data();
    p.tokens = tokens_;
    p.gated = gating_out();
    p.dispatched = dispatch_view();
    p.d_grad_weight = weight_grad_ ? buffer<float>("grad_weight").data() : nullptr;
    p.weights = weights;
    p.accumulate = false;
    p.d_grad_logits = buffer<float>("grad_logits").data();
    if (auto s = cpu::gating_backward(cfg_, p, ex); !s) return s;
    grad_logits =
        buffer<float>("grad_logits").first(static_cast<std::size_t>(tokens_ * cfg_.num_experts));
    return status::success();
  }

  // ---- the routed batch (valid after a successful route())
  [[nodiscard]] const routing_config& config() const noexcept { return cfg_; }
  [[nodiscard]] std::int64_t max_tokens() const noexcept { return max_tokens_; }
  [[nodiscard]] std::int64_t hidden() const noexcept { return hidden_; }
  [[nodiscard]] std::int64_t max_rows() const noexcept { return max_rows_; }
  [[nodiscard]] layout_kind layout_kind_used() const noexcept { return kind_; }
  [[nodiscard]] std::int64_t tokens() const noexcept { return tokens_; }
  /// Rows of the expert buffer for the routed batch (its layout's max_rows for T tokens).
  [[nodiscard]] std::int64_t rows() const noexcept { return rows_for(tokens_); }
  [[nodiscard]] bool routed() const noexcept { return routed_; }
  /// The gating outputs, the dispatch decisions and the layout: views for the params API.
  [[nodiscard]] const_gating_result gated() const { return gating_out(); }
  [[nodiscard]] const_dispatch_result dispatched() const { return dispatch_view(); }
  [[nodiscard]] const_layout_result layout() const { return layout_view(); }
  [[nodiscard]] const dispatch_totals& totals() const {
    return *buffer<dispatch_totals>("totals").data();
  }
  [[nodiscard]] router_losses losses() const {
    const auto l = buffer<double>("losses");
    return {l[0], l[1], l[2]};
  }
  /// [ET + 1] the first row of each expert's segment in the expert buffer.
  [[nodiscard]] std::span<const std::int64_t> offsets() const {
    return buffer<std::int64_t>("offsets").first(static_cast<std::size_t>(cfg_.total_experts()) +
                                                 1);
  }
  /// Bytes the router holds (one allocation).
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }

 private:
  static void throw_if(const status& s) {
    if (!s) throw error(s);
  }
  [[nodiscard]] bool residual() const noexcept {
    return cfg_.dispatch.dropped == drop_policy::residual;
  }
  [[nodiscard]] std::int64_t rows_for(std::int64_t T) const noexcept {
    std::int64_t r = 0;
    (void)layout_rows(cfg_, T, kind_, opt_.block_size, 0, r);
    return r;
  }
  /// A view of `per_row` x `rows` elements must be exactly that long.
  [[nodiscard]] status check_rows(const char* op, const char* name, std::size_t got,
                                  std::int64_t rows, std::int64_t per_row = -1) const {
    if (!routed_)
      return status::make(status_code::invalid_argument,
                          std::string("router::") + op + ": no routed batch (call route first)");
    const std::int64_t want = rows * (per_row < 0 ? hidden_ : per_row);
    if (static_cast<std::int64_t>(got) != want)
      return status::make(status_code::invalid_shape,
                          std::string("router::") + op + ": " + name + " has " +
                              std::to_string(got) + " elements, expected " + std::to_string(want));
    return status::success();
  }
  template <class T>
  [[nodiscard]] std::span<T> buffer(std::string_view name) const {
    for (std::size_t i = 0; i < shapes_.size(); ++i)
      if (shapes_[i].name == name)
        return {reinterpret_cast<T*>(at_[i]), shapes_[i].bytes() / sizeof(T)};
    return {};
  }
  template <class T>
  [[nodiscard]] T* optional_buffer(std::string_view name) const {
    return buffer<T>(name).data();
  }
  [[nodiscard]] gating_result gating_out() const {
    gating_result o;
    o.d_ids = optional_buffer<std::int32_t>("ids");
    o.d_gates = optional_buffer<float>("gates");
    o.d_reroute_ids = optional_buffer<std::int32_t>("reroute_ids");
    o.d_logsumexp = optional_buffer<float>("logsumexp");
    o.sums = {optional_buffer<double>("aux_score_sum"),
              optional_buffer<std::int64_t>("aux_count"),
              optional_buffer<std::int64_t>("valid_tokens"),
              cfg_.loss.z_coefficient != 0.0f ? optional_buffer<double>("z_sum_squares") : nullptr,
              optional_buffer<std::int64_t>("nonfinite"),
              optional_buffer<double>("seq_score_sum"),
              optional_buffer<std::int64_t>("seq_count"),
              optional_buffer<std::int64_t>("seq_tokens")};
    o.d_token_priority = optional_buffer<float>("token_priority");
    o.d_second_skipped = optional_buffer<std::uint8_t>("second_skipped");
    return o;
  }
  [[nodiscard]] dispatch_result dispatch_out() const {
    return {optional_buffer<std::int32_t>("expert"),    optional_buffer<std::int32_t>("slot"),
            optional_buffer<float>("weight"),           optional_buffer<fate>("fate"),
            optional_buffer<std::int64_t>("requested"), optional_buffer<std::int64_t>("kept"),
            optional_buffer<std::int64_t>("rerouted"),  optional_buffer<std::int64_t>("dropped"),
            optional_buffer<std::int64_t>("received"),  optional_buffer<std::int64_t>("load"),
            optional_buffer<dispatch_totals>("totals")};
  }
  [[nodiscard]] const_dispatch_result dispatch_view() const { return dispatch_out(); }
  [[nodiscard]] layout_result layout_out() const {
    layout_result o;
    o.d_offsets = optional_buffer<std::int64_t>("offsets");
    o.d_rows_used = optional_buffer<std::int64_t>("rows_used");
    o.d_row_token = optional_buffer<std::int32_t>("row_token");
    o.d_assignment_row = optional_buffer<std::int64_t>("assignment_row");
    o.d_block_expert = optional_buffer<std::int32_t>("block_expert");
    o.d_num_rows = optional_buffer<std::int64_t>("num_rows");
    return o;
  }
  [[nodiscard]] const_layout_result layout_view() const { return layout_out(); }

  routing_config cfg_;
  std::int64_t max_tokens_ = 0, hidden_ = 0, max_rows_ = 0, tokens_ = 0;
  router_options opt_;
  layout_kind kind_ = layout_kind::padded;
  std::vector<buffer_shape> shapes_;
  std::vector<std::byte*> at_;
  Allocator block_;
  std::byte* base_ = nullptr;
  std::size_t bytes_ = 0;
  bool routed_ = false;
  bool residual_grad_ = false;  ///< grad_x holds combine_backward's residual pass-through
  bool weight_grad_ = false;    ///< grad_weight holds combine_backward's, for gating_backward
};

}  // namespace moeroute::cpu
