// SPDX-License-Identifier: Apache-2.0
// The buffers of an owning router (cpu::router, cuda::router) as one block: every output of
// gating, dispatch, layout and the losses for up to max_tokens tokens (moeroute/shapes.hpp),
// the hidden-state rows of permute / combine and their gradients, and the stages' workspace —
// laid out at 256-byte boundaries, and the stage views over them. Memory-agnostic plain C++: a
// router allocates the block (host or device) and attaches it; this class never allocates it
// and never reads it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <moeroute/config.hpp>
#include <moeroute/params/layout.hpp>
#include <moeroute/params/losses.hpp>
#include <moeroute/shapes.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute {

/// What an owning router is built for, beside its config, maximum batch and hidden size.
struct router_options {
  /// The expert buffer: padded [E, C] or compact. Unset: padded with a capacity, compact for a
  /// dropless config (capacity_mode::unbounded).
  std::optional<layout_kind> layout{};
  std::int64_t block_size = 1;  ///< compact: segments rounded up to this many rows
  bool logsumexp = false;       ///< keep the logsumexp [T] (always kept with a z-loss)
  /// Compute the aux / sequence-aux / z losses and the gating sums under them. false is the
  /// inference path (a serving engine's): gating makes the ids and gates only (no P row, no
  /// counts, one kernel on the GPU), losses() reads 0 and gating_backward is refused; it needs
  /// routing_config::training = false.
  bool losses = true;
};

/// The losses of one routed batch.
struct router_losses {
  double aux = 0.0;           ///< load-balancing loss, with its coefficient
  double sequence_aux = 0.0;  ///< per-sequence aux loss (loss.sequence_length > 0)
  double z = 0.0;             ///< router z-loss, with its coefficient
};

/// @brief The sizes and views of an owning router's buffers; see the file comment.
class router_buffers {
 public:
  /// @param element_bytes   sizeof the hidden-state element
  /// @param workspace_bytes (cfg, T) -> the bytes the backend's gating and dispatch need,
  ///                        called once the config and max_tokens are checked
  /// @throws moeroute::error naming the bad argument
  template <class WorkspaceBytes>
  router_buffers(const routing_config& cfg, std::int64_t max_tokens, std::int64_t hidden,
                 std::size_t element_bytes, const router_options& options,
                 WorkspaceBytes&& workspace_bytes)
      : cfg_(cfg), max_tokens_(max_tokens), hidden_(hidden), options_(options) {
    throw_if_error(validate(cfg_));
    throw_if_error(validate_tokens(cfg_, max_tokens_));
    if (!options_.losses && cfg_.training)
      throw_if_error(status::make(status_code::invalid_argument,
                                  "router: options.losses = false (the inference path) needs "
                                  "routing_config::training = false"));
    const std::size_t workspace = workspace_bytes(cfg_, max_tokens_);
    if (hidden_ < 0)
      throw_if_error(
          status::make(status_code::invalid_argument,
                       "router: hidden = " + std::to_string(hidden_) + ": must be >= 0"));
    kind_ = options_.layout.value_or(cfg_.capacity.mode == capacity_mode::unbounded
                                         ? layout_kind::compact
                                         : layout_kind::padded);
    if (kind_ == layout_kind::padded && options_.block_size != 1)
      throw_if_error(status::make(status_code::invalid_argument,
                                  "router: block_size = " + std::to_string(options_.block_size) +
                                      " with the padded layout (only the compact one aligns "
                                      "segments)"));
    throw_if_error(layout_rows(cfg_, max_tokens_, kind_, options_.block_size, 0, max_rows_));
    const std::int64_t T = max_tokens_, E = cfg_.num_experts, k = cfg_.top_k;
    shapes_ = gating_buffers(cfg_, T, {options_.logsumexp || cfg_.loss.z_coefficient != 0.0f});
    for (auto& s : dispatch_buffers(cfg_, T)) shapes_.push_back(s);
    for (auto& s : layout_buffers(cfg_, T, kind_, options_.block_size, max_rows_))
      shapes_.push_back(s);
    // rows of hidden states, as bytes (the router's element type)
    const std::int64_t row = hidden_ * static_cast<std::int64_t>(element_bytes);
    shapes_.push_back({"expert_in", buffer_type::u8, {max_rows_, row}});  // permute's output
    shapes_.push_back({"y", buffer_type::u8, {T, row}});                  // combine's output
    shapes_.push_back({"grad_expert_out", buffer_type::u8, {max_rows_, row}});
    shapes_.push_back({"grad_x", buffer_type::u8, {T, row}});
    shapes_.push_back({"grad_weight", buffer_type::f32, {T, k}});
    shapes_.push_back({"grad_logits", buffer_type::f32, {T, E}});
    shapes_.push_back({"losses", buffer_type::f64, {3}});     // aux, sequence aux, z
    shapes_.push_back({"token_mask", buffer_type::u8, {T}});  // a device token count's rows
    shapes_.push_back({"workspace", buffer_type::u8, {static_cast<std::int64_t>(workspace)}});
    at_.assign(shapes_.size(), nullptr);
  }

  /// Bytes to allocate for the block (alignment slack included).
  [[nodiscard]] std::size_t bytes() const noexcept {
    return buffer_block_bytes(shapes_) + buffer_alignment;
  }
  /// Lays the buffers out in `block` (bytes() long, any alignment).
  void attach(std::byte* block) noexcept {
    auto* aligned = reinterpret_cast<std::byte*>(
        (reinterpret_cast<std::uintptr_t>(block) + buffer_alignment - 1) / buffer_alignment *
        buffer_alignment);
    carve_buffers(shapes_, aligned, at_);
    // the stage views, made once: a routing call hands them to every stage (looking ~30
    // buffers up by name on each call would cost a decode step microseconds for nothing)
    gating_ = make_gating_out();
    dispatch_ = make_dispatch_out();
    layout_ = make_layout_out();
  }

  /// The buffer `name` as T (empty when the config has none).
  template <class T>
  [[nodiscard]] std::span<T> get(std::string_view name) const noexcept {
    for (std::size_t i = 0; i < shapes_.size(); ++i)
      if (shapes_[i].name == name)
        return {reinterpret_cast<T*>(at_[i]), shapes_[i].bytes() / sizeof(T)};
    return {};
  }
  template <class T>
  [[nodiscard]] T* ptr(std::string_view name) const noexcept {
    return get<T>(name).data();
  }

  /// Views over the buffers, for the params structs (made by attach()).
  [[nodiscard]] const gating_result& gating_out() const noexcept { return gating_; }
  [[nodiscard]] const dispatch_result& dispatch_out() const noexcept { return dispatch_; }
  [[nodiscard]] const layout_result& layout_out() const noexcept { return layout_; }
  /// The layout params for a batch of `tokens` (its max_rows: the layout's bound for T).
  [[nodiscard]] layout_params layout_params_for(std::int64_t tokens,
                                                const_dispatch_result dispatched) const noexcept {
    layout_params l;
    l.kind = kind_;
    l.block_size = options_.block_size;
    l.tokens = tokens;
    l.max_rows = rows_for(tokens);
    l.dispatched = dispatched;
    l.out = layout_out();
    return l;
  }
  /// The losses params for a batch of `tokens`: the gating sums and the three loss slots (aux,
  /// sequence aux where the config has sequences, z).
  [[nodiscard]] loss_params loss_params_for(std::int64_t tokens) const noexcept {
    loss_params lp;
    lp.tokens = tokens;
    lp.sums = gating_out().sums;
    double* losses = ptr<double>("losses");
    lp.d_aux_loss = losses;
    lp.d_sequence_aux_loss = cfg_.loss.sequence_length > 0 ? losses + 1 : nullptr;
    lp.d_z_loss = losses + 2;
    return lp;
  }

  [[nodiscard]] const routing_config& config() const noexcept { return cfg_; }
  [[nodiscard]] std::int64_t max_tokens() const noexcept { return max_tokens_; }
  [[nodiscard]] std::int64_t hidden() const noexcept { return hidden_; }
  [[nodiscard]] const router_options& options() const noexcept { return options_; }
  [[nodiscard]] std::int64_t max_rows() const noexcept { return max_rows_; }
  [[nodiscard]] layout_kind kind() const noexcept { return kind_; }
  /// Rows of the expert buffer for a batch of T tokens (the layout's bound for T).
  [[nodiscard]] std::int64_t rows_for(std::int64_t tokens) const noexcept {
    std::int64_t r = 0;
    (void)layout_rows(cfg_, tokens, kind_, options_.block_size, 0, r);
    return r;
  }
  [[nodiscard]] bool residual() const noexcept {
    return cfg_.dispatch.dropped == drop_policy::residual;
  }
  /// "router::<op>: no routed batch" unless `routed`.
  [[nodiscard]] static status check_routed(const char* op, bool routed) {
    if (routed) return status::success();
    return status::make(status_code::invalid_argument,
                        std::string("router::") + op + ": no routed batch (call route first)");
  }
  /// Checks a batch of `tokens` against the router (0 <= T <= max_tokens; T = 0 routes
  /// nothing), naming `op`.
  [[nodiscard]] status check_tokens(const char* op, std::int64_t tokens) const {
    if (tokens < 0 || tokens > max_tokens_)
      return status::make(status_code::invalid_shape,
                          std::string("router::") + op + ": " + std::to_string(tokens) +
                              " tokens, the router holds " + std::to_string(max_tokens_) +
                              " (max_tokens)");
    return status::success();
  }

 private:
  [[nodiscard]] gating_result make_gating_out() const noexcept {
    gating_result o;
    o.d_ids = ptr<std::int32_t>("ids");
    o.d_gates = ptr<float>("gates");
    o.d_reroute_ids = ptr<std::int32_t>("reroute_ids");
    o.d_logsumexp = ptr<float>("logsumexp");
    o.sums = {ptr<double>("aux_score_sum"),
              ptr<std::int64_t>("aux_count"),
              ptr<std::int64_t>("valid_tokens"),
              cfg_.loss.z_coefficient != 0.0f ? ptr<double>("z_sum_squares") : nullptr,
              ptr<std::int64_t>("nonfinite"),
              ptr<double>("seq_score_sum"),
              ptr<std::int64_t>("seq_count"),
              ptr<std::int64_t>("seq_tokens")};
    o.d_token_priority = ptr<float>("token_priority");
    o.d_second_skipped = ptr<std::uint8_t>("second_skipped");
    if (!options_.losses) {  // the inference path: no sum, the logsumexp only if asked for
      o.sums = {};
      if (!options_.logsumexp) o.d_logsumexp = nullptr;
    }
    return o;
  }
  [[nodiscard]] dispatch_result make_dispatch_out() const noexcept {
    return {ptr<std::int32_t>("expert"),    ptr<std::int32_t>("slot"),
            ptr<float>("weight"),           ptr<fate>("fate"),
            ptr<std::int64_t>("requested"), ptr<std::int64_t>("kept"),
            ptr<std::int64_t>("rerouted"),  ptr<std::int64_t>("dropped"),
            ptr<std::int64_t>("received"),  ptr<std::int64_t>("load"),
            ptr<dispatch_totals>("totals")};
  }
  [[nodiscard]] layout_result make_layout_out() const noexcept {
    layout_result o;
    o.d_offsets = ptr<std::int64_t>("offsets");
    o.d_rows_used = ptr<std::int64_t>("rows_used");
    o.d_row_token = ptr<std::int32_t>("row_token");
    o.d_assignment_row = ptr<std::int64_t>("assignment_row");
    o.d_block_expert = ptr<std::int32_t>("block_expert");
    o.d_num_rows = ptr<std::int64_t>("num_rows");
    return o;
  }

  routing_config cfg_;
  std::int64_t max_tokens_ = 0, hidden_ = 0, max_rows_ = 0;
  router_options options_;
  layout_kind kind_ = layout_kind::padded;
  std::vector<buffer_shape> shapes_;
  std::vector<std::byte*> at_;
  gating_result gating_{};
  dispatch_result dispatch_{};
  layout_result layout_{};
};

/// @brief `bytes` bytes allocated through `Allocator` (host or device alike) on construction,
///        freed on destruction: the one allocation of an owning router.
template <class Allocator>
class owned_block {
 public:
  owned_block(std::size_t bytes, const Allocator& alloc)
      : alloc_(alloc),
        bytes_(bytes),
        p_(std::allocator_traits<Allocator>::allocate(alloc_, bytes)) {}
  owned_block(const owned_block&) = delete;
  owned_block& operator=(const owned_block&) = delete;
  ~owned_block() { std::allocator_traits<Allocator>::deallocate(alloc_, p_, bytes_); }
  [[nodiscard]] std::byte* get() const noexcept { return p_; }

 private:
  Allocator alloc_;
  std::size_t bytes_ = 0;
  std::byte* p_ = nullptr;
};

/// @brief What cpu::router and cuda::router share: their buffers' layout, the routed batch's
///        state and the accessors that do not depend on where the memory is. Each router adds
///        its allocation (owned_block), its backend's calls and its way of reading results.
class router_core {
 public:
  [[nodiscard]] const routing_config& config() const noexcept { return b_.config(); }
  [[nodiscard]] std::int64_t max_tokens() const noexcept { return b_.max_tokens(); }
  [[nodiscard]] std::int64_t hidden() const noexcept { return b_.hidden(); }
  [[nodiscard]] std::int64_t max_rows() const noexcept { return b_.max_rows(); }
  [[nodiscard]] layout_kind layout_kind_used() const noexcept { return b_.kind(); }
  /// Tokens of the routed batch.
  [[nodiscard]] std::int64_t tokens() const noexcept { return tokens_; }
  /// Rows of the expert buffer for the routed batch (its layout's bound for T tokens).
  [[nodiscard]] std::int64_t rows() const noexcept { return b_.rows_for(tokens_); }
  [[nodiscard]] bool routed() const noexcept { return routed_; }
  /// The gating outputs, the dispatch decisions and the layout: views for the params API.
  [[nodiscard]] const_gating_result gated() const noexcept { return b_.gating_out(); }
  [[nodiscard]] const_dispatch_result dispatched() const noexcept { return b_.dispatch_out(); }
  [[nodiscard]] const_layout_result layout() const noexcept { return b_.layout_out(); }
  /// Bytes the router holds (one allocation).
  [[nodiscard]] std::size_t bytes() const noexcept { return b_.bytes(); }

 protected:
  template <class WorkspaceBytes>
  router_core(const routing_config& cfg, std::int64_t max_tokens, std::int64_t hidden,
              std::size_t element_bytes, const router_options& options,
              WorkspaceBytes&& workspace_bytes)
      : b_(cfg, max_tokens, hidden, element_bytes, options, workspace_bytes) {}

  /// A new batch of `tokens`: nothing routed, no gradient kept.
  void begin_batch(std::int64_t tokens) noexcept {
    tokens_ = tokens;
    routed_ = residual_grad_ = weight_grad_ = false;
  }
  [[nodiscard]] status check_routed(const char* op) const {
    return router_buffers::check_routed(op, routed_);
  }
  /// op needs the loss sums, which a router built with options.losses = false does not keep.
  [[nodiscard]] status check_losses_kept(const char* op) const {
    if (b_.options().losses) return status::success();
    return status::make(status_code::invalid_argument,
                        std::string("router::") + op +
                            ": the router was built with options.losses = false (the inference "
                            "path keeps no loss sums)");
  }

  router_buffers b_;
  std::int64_t tokens_ = 0;
  bool routed_ = false;
  bool residual_grad_ = false;  ///< grad_x holds combine_backward's residual pass-through
  bool weight_grad_ = false;    ///< grad_weight holds combine_backward's, for gating_backward
};

}  // namespace moeroute
