// SPDX-License-Identifier: Apache-2.0
// The owning router of one MoE layer on the GPU: every device buffer the launchers write for up
// to `max_tokens` tokens of `hidden` columns (one block, laid out by router_buffers from
// moeroute/shapes.hpp, allocated once through the Allocator parameter — cudaMalloc by default,
// an engine's caching allocator instead), and the launchers underneath: gating, dispatch,
// layout and the losses in one route(), then permute / combine and their backward passes, each
// on the caller's stream, last. Like the launchers, no call allocates or synchronises, so a
// step can be captured in a CUDA graph; results stay on the device (gated(), dispatched(),
// layout(), expert_in(), y(), ...) until summary() copies the counts back, which synchronises.
// Construction throws moeroute::error naming a bad argument; the calls return a status.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include <moeroute/config.hpp>
#include <moeroute/cuda/combine.cuh>
#include <moeroute/cuda/combine_backward.cuh>
#include <moeroute/cuda/device_allocator.cuh>
#include <moeroute/cuda/dispatch.cuh>
#include <moeroute/cuda/gating.cuh>
#include <moeroute/cuda/gating_backward.cuh>
#include <moeroute/cuda/launch.cuh>
#include <moeroute/cuda/layout.cuh>
#include <moeroute/cuda/losses.cuh>
#include <moeroute/cuda/permute.cuh>
#include <moeroute/cuda/permute_backward.cuh>
#include <moeroute/cuda/token_mask.cuh>
#include <moeroute/router_buffers.hpp>
#include <moeroute/status.hpp>
#include <moeroute/types.hpp>

namespace moeroute::cuda {

using moeroute::router_losses;
using moeroute::router_options;

/// What a routed batch did, copied to the host by router::summary (which synchronises).
struct router_summary {
  dispatch_totals totals{};
  router_losses losses{};
  std::int64_t num_rows = 0;                  ///< rows of the layout in use
  std::vector<std::int64_t> offsets;          ///< [ET + 1] first row of each expert's segment
  std::vector<std::int64_t> requested, kept;  ///< [E] by the expert first chosen; kept there
  std::vector<std::int64_t> load;             ///< [ET] slots in use at each expert
  [[nodiscard]] double drop_rate(std::int64_t assignments) const noexcept {
    const std::int64_t live = assignments - totals.masked;
    return live > 0 ? static_cast<double>(totals.dropped) / static_cast<double>(live) : 0.0;
  }
};

/// @brief A batch of `rows` rows (<= the router's max_tokens) whose real token count n is in
///        device memory: rows [n, rows) are padding. The CUDA-graph pattern of inference
///        engines: buffers and one captured graph for the largest batch, the count written
///        before each replay. n is read on the device and clamped to [0, rows].
struct device_tokens {
  std::int64_t rows = 0;
  const std::int64_t* d_count = nullptr;  ///< [1] int64, device memory
};

/// @brief One MoE layer's routing on the GPU, owning its device buffers.
/// @tparam Element  the hidden states' type: float, __half or __nv_bfloat16 (logits may be any
///                  of the three, per call)
/// @tparam Allocator allocates the one block of device bytes the router owns
template <class Element = float, class Allocator = device_allocator<std::byte>>
class router : public router_core {
  static_assert(kernels::is_routed_element_v<Element>,
                "Element must be float, __half or __nv_bfloat16");

 public:
  /// @brief Sizes and allocates every device buffer for batches of up to `max_tokens` tokens
  ///        of `hidden` columns. @throws moeroute::error naming the bad argument.
  router(const routing_config& cfg, std::int64_t max_tokens, std::int64_t hidden,
         const router_options& options = {}, const Allocator& alloc = Allocator())
      : router_core(cfg, max_tokens, hidden, sizeof(Element), options, workspace_bytes),
        block_(b_.bytes(), alloc) {
    b_.attach(block_.get());
    // read as 0 where losses are not computed (options.losses = false)
    throw_if_cuda_error(cudaMemset(b_.ptr<double>("losses"), 0, 3 * sizeof(double)),
                        "router: cudaMemset(losses)");
  }

  /// @brief Gating, dispatch, layout and losses of `d_logits` [T, E] (T <= max_tokens), on
  ///        `stream`. Asynchronous.
  /// @param d_bias  [E] f32 the expert bias (required iff gating.expert_bias)
  /// @param d_valid [T] uint8 1 = real token, 0 = padding (null: all valid)
  /// @return success, or the first failing launcher's status (naming the field)
  template <class Logit>
  [[nodiscard]] status route(const Logit* d_logits, std::int64_t tokens,
                             const float* d_bias = nullptr, const std::uint8_t* d_valid = nullptr,
                             cudaStream_t stream = nullptr) {
    return route(d_logits, tokens, gating_replay{}, d_bias, d_valid, stream);
  }

  /// @brief route() with routing replay (docs/replay.md): replay.d_ids [T, k] (device, -1 = the
  ///        router chooses) forces each slot's expert, the gates recomputed from `d_logits`;
  ///        replay.min_score_ratio, d_replaced and d_invalid (device) as in gating_replay.
  template <class Logit>
  [[nodiscard]] status route(const Logit* d_logits, std::int64_t tokens,
                             const gating_replay& replay, const float* d_bias = nullptr,
                             const std::uint8_t* d_valid = nullptr, cudaStream_t stream = nullptr) {
    return route_rows(d_logits, tokens, nullptr, replay, d_bias, d_valid, stream);
  }

  /// @brief route() of `batch.rows` rows of which the first *batch.d_count are real (see
  ///        device_tokens): the same ids, gates, fates, slots, weights, counts and losses as
  ///        route() of those tokens alone (the capacity is that of n tokens, the losses average
  ///        over them), the padding rows masked. Every launch is the same whatever n is, so a
  ///        graph captured once serves every count. Not with capacity groups.
  template <class Logit>
  [[nodiscard]] status route(const Logit* d_logits, const device_tokens& batch,
                             const float* d_bias = nullptr, const std::uint8_t* d_valid = nullptr,
                             cudaStream_t stream = nullptr) {
    return route(d_logits, batch, gating_replay{}, d_bias, d_valid, stream);
  }

  /// @brief route() of a device_tokens batch with routing replay.
  template <class Logit>
  [[nodiscard]] status route(const Logit* d_logits, const device_tokens& batch,
                             const gating_replay& replay, const float* d_bias = nullptr,
                             const std::uint8_t* d_valid = nullptr, cudaStream_t stream = nullptr) {
    if (batch.d_count == nullptr)
      return status::make(status_code::invalid_argument,
                          "route: device_tokens.d_count is null (pass the row count as T for a "
                          "batch without padding)");
    return route_rows(d_logits, batch.rows, batch.d_count, replay, d_bias, d_valid, stream);
  }

 private:
  /// route() of `tokens` rows, the first *d_count of them real when d_count is given.
  template <class Logit>
  [[nodiscard]] status route_rows(const Logit* d_logits, std::int64_t tokens,
                                  const std::int64_t* d_count, const gating_replay& replay,
                                  const float* d_bias, const std::uint8_t* d_valid,
                                  cudaStream_t stream) {
    const routing_config& cfg = b_.config();
    if (auto s = b_.check_tokens("route", tokens); !s) return s;
    // before anything runs (dispatch, after gating, would refuse the same)
    if (auto s = check_token_count(cfg, d_count != nullptr); !s) return s;
    begin_batch(tokens);
    if (d_count != nullptr && tokens > 0) {  // padding rows out of every stage
      std::uint8_t* mask = b_.ptr<std::uint8_t>("token_mask");
      if (auto s = cuda::token_mask({tokens, d_count, d_valid, mask}, stream); !s) return s;
      d_valid = mask;
    }
    gating_params<Logit> g;
    g.d_logits = d_logits;
    g.tokens = tokens;
    g.d_bias = d_bias;
    g.d_valid = d_valid;
    g.out = b_.gating_out();
    g.replay = replay;
    const auto ws = b_.get<std::byte>("workspace");
    if (auto s = cuda::gating(cfg, g, ws.data(), ws.size(), stream); !s) return s;
    dispatch_params d;
    d.tokens = tokens;
    d.gated = g.out;
    d.d_valid = d_valid;
    d.d_token_count = d_count;
    d.out = b_.dispatch_out();
    if (auto s = cuda::dispatch(cfg, d, ws.data(), ws.size(), stream); !s) return s;
    if (auto s = cuda::layout(cfg, b_.layout_params_for(tokens, d.out), stream); !s) return s;
    if (b_.options().losses)  // (the inference path computes none)
      if (auto s = cuda::losses(cfg, b_.loss_params_for(tokens), stream); !s) return s;
    routed_ = true;
    return status::success();
  }

 public:
  /// @brief expert_in() = the rows of `d_x` [T, hidden] in the routed layout: [rows(), hidden].
  [[nodiscard]] status permute(const Element* d_x, cudaStream_t stream = nullptr) {
    if (auto s = check_routed("permute"); !s) return s;
    const permute_params<Element> p{d_x, tokens_, b_.hidden(), layout(), rows(), expert_in()};
    return cuda::permute(b_.config(), p, stream);
  }

  /// @brief y() [T, hidden] = sum_j weight[t, j] * d_expert_out[row(t, j)] (fp32, choice
  ///        order); with drop_policy::residual a valid token with nothing kept gets d_x[t].
  /// @param d_expert_out [rows(), hidden]; @param d_x [T, hidden] (residual policy only)
  [[nodiscard]] status combine(const Element* d_expert_out, const Element* d_x = nullptr,
                               cudaStream_t stream = nullptr) {
    if (auto s = check_routed("combine"); !s) return s;
    const combine_params<Element> p{d_expert_out, rows(),       tokens_, b_.hidden(),
                                    layout(),     dispatched(), d_x,     y()};
    return cuda::combine(b_.config(), p, stream);
  }

  /// @brief grad_expert_out() [rows(), hidden] and the combine weights' gradient (kept for
  ///        gating_backward) from `d_dy` [T, hidden]; the residual pass-through's d x is added
  ///        by permute_backward.
  [[nodiscard]] status combine_backward(const Element* d_dy, const Element* d_expert_out,
                                        cudaStream_t stream = nullptr) {
    if (auto s = check_routed("combine_backward"); !s) return s;
    combine_backward_params<Element> p;
    p.d_expert_out = d_expert_out;
    p.d_dy = d_dy;
    p.rows = rows();
    p.tokens = tokens_;
    p.hidden = b_.hidden();
    p.layout = layout();
    p.dispatched = dispatched();
    p.d_grad_expert_out = grad_expert_out();
    p.d_grad_weight = b_.ptr<float>("grad_weight");
    p.d_grad_x = b_.residual() ? grad_x() : nullptr;
    if (auto s = cuda::combine_backward(b_.config(), p, stream); !s) return s;
    residual_grad_ = b_.residual();
    weight_grad_ = true;
    return status::success();
  }

  /// @brief grad_x() [T, hidden] = each token's row gradients of `d_grad_expert_in` [rows(),
  ///        hidden] summed, plus combine_backward's residual pass-through.
  [[nodiscard]] status permute_backward(const Element* d_grad_expert_in,
                                        cudaStream_t stream = nullptr) {
    if (auto s = check_routed("permute_backward"); !s) return s;
    permute_backward_params<Element> p;
    p.d_grad_buf = d_grad_expert_in;
    p.rows = rows();
    p.tokens = tokens_;
    p.hidden = b_.hidden();
    p.layout = layout();
    p.accumulate = residual_grad_;
    p.d_grad_x = grad_x();
    if (auto s = cuda::permute_backward(b_.config(), p, stream); !s) return s;
    residual_grad_ = false;
    return status::success();
  }

  /// @brief grad_logits() [T, E] f32: the routing term (through combine_backward's weight
  ///        gradient, when it ran since route()) and the losses' terms.
  /// @param d_logits the forward's logits; @param weights dL/d(each term) (default 1)
  template <class Logit>
  [[nodiscard]] status gating_backward(const Logit* d_logits,
                                       const gating_backward_weights& weights = {},
                                       cudaStream_t stream = nullptr) {
    if (auto s = check_routed("gating_backward"); !s) return s;
    if (auto s = check_losses_kept("gating_backward"); !s) return s;
    gating_backward_params<Logit> p;
    p.d_logits = d_logits;
    p.tokens = tokens_;
    p.gated = gated();
    p.dispatched = dispatched();
    p.d_grad_weight = weight_grad_ ? b_.ptr<float>("grad_weight") : nullptr;
    p.weights = weights;
    p.accumulate = false;
    p.d_grad_logits = grad_logits();
    return cuda::gating_backward(b_.config(), p, stream);
  }

  /// @brief The counts, losses and offsets of the routed batch, copied to the host.
  /// @note Synchronises `stream` (cudaMemcpyAsync, then cudaStreamSynchronize).
  [[nodiscard]] status summary(router_summary& out, cudaStream_t stream = nullptr) const {
    const std::int32_t E = b_.config().num_experts, ET = b_.config().total_experts();
    out.offsets.resize(static_cast<std::size_t>(ET) + 1);
    out.requested.resize(static_cast<std::size_t>(E));
    out.kept.resize(static_cast<std::size_t>(E));
    out.load.resize(static_cast<std::size_t>(ET));
    double losses[3] = {};
    const auto copy = [&](void* to, const void* from, std::size_t bytes) {
      return from_cuda(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToHost, stream),
                       "router::summary: cudaMemcpyAsync");
    };
    for (const status& s :
         {copy(&out.totals, b_.ptr<dispatch_totals>("totals"), sizeof(dispatch_totals)),
          copy(&out.num_rows, b_.ptr<std::int64_t>("num_rows"), sizeof(std::int64_t)),
          copy(losses, b_.ptr<double>("losses"), sizeof losses),
          copy(out.offsets.data(), b_.ptr<std::int64_t>("offsets"), out.offsets.size() * 8),
          copy(out.requested.data(), b_.ptr<std::int64_t>("requested"), out.requested.size() * 8),
          copy(out.kept.data(), b_.ptr<std::int64_t>("kept"), out.kept.size() * 8),
          copy(out.load.data(), b_.ptr<std::int64_t>("load"), out.load.size() * 8)})
      if (!s) return s;
    if (auto s = from_cuda(cudaStreamSynchronize(stream), "router::summary"); !s) return s;
    out.losses = {losses[0], losses[1], losses[2]};
    return status::success();
  }

  // ---- device buffers of the routed batch (valid after the call that writes them); the
  // config, sizes and views: router_core
  [[nodiscard]] Element* expert_in() const noexcept { return b_.ptr<Element>("expert_in"); }
  [[nodiscard]] Element* y() const noexcept { return b_.ptr<Element>("y"); }
  [[nodiscard]] Element* grad_expert_out() const noexcept {
    return b_.ptr<Element>("grad_expert_out");
  }
  [[nodiscard]] Element* grad_x() const noexcept { return b_.ptr<Element>("grad_x"); }
  [[nodiscard]] float* grad_logits() const noexcept { return b_.ptr<float>("grad_logits"); }

 private:
  /// What gating and dispatch need, the one workspace of both (they run one after the other).
  static std::size_t workspace_bytes(const routing_config& cfg, std::int64_t tokens) {
    return std::max(gating_workspace_bytes(cfg, tokens), dispatch_workspace_bytes(cfg, tokens));
  }

  owned_block<Allocator> block_;  ///< the one allocation, laid out by b_
};

}  // namespace moeroute::cuda
