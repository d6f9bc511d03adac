// SPDX-License-Identifier: Apache-2.0
// The stages on the caller's arrays: each binding reads its named arrays (checked against the
// specs), fills the params struct the C++ API takes, releases the GIL and launches the stage
// where the arrays live: moeroute::cpu for host arrays, the CUDA launchers on the caller's
// stream for device arrays (launch.hpp). A failed status becomes moeroute.Error carrying the
// library's message.
#include "ops.hpp"

#include <pybind11/numpy.h>

#include <moeroute/cpu.hpp>
#include <moeroute/params/checks.hpp>
#include <moeroute/status.hpp>
#include <moeroute/workspace.hpp>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>

#include "launch.hpp"
#include "specs.hpp"

namespace moeroute::python {

namespace {

constexpr std::int64_t any = -1;
constexpr elem_set element_types{elem::f32, elem::f16, elem::bf16};

/// Calls f(Element{}) for the C++ element type of `e` (f32, f16, bf16).
template <class F>
void with_element(elem e, F&& f) {
  switch (e) {
    case elem::f16:
      f(half_bits{});
      return;
    case elem::bf16:
      f(bf16_bits{});
      return;
    default:
      f(float{});
      return;
  }
}

/// Runs `call` without the GIL (the arrays stay alive in `a`) and raises on failure.
template <class Call>
void run(const char* op, Call&& call) {
  status s;
  {
    py::gil_scoped_release nogil;
    s = call();
  }
  raise_if(s, op);
}

std::uint8_t* valid_of(call_arrays& a, std::int64_t T) {
  return a.in<std::uint8_t>({"valid", {T}, elem::u8}, false);
}

void* workspace_of(call_arrays& a, std::size_t bytes) {
  return a.out<std::byte>({"workspace", {static_cast<std::int64_t>(bytes)}, elem::u8}, bytes > 0);
}

/// Reads the gating outputs a later stage takes (only those its config lists).
/// (`given`: the gating specs when the caller has them, else made here)
const_gating_result gated_of(call_arrays& a, const routing_config& cfg, std::int64_t T,
                             const std::vector<spec>* given = nullptr) {
  const auto made = given != nullptr ? std::vector<spec>{} : gating_outputs(cfg, T, false);
  const auto& specs = given != nullptr ? *given : made;
  const_gating_result g;
  g.d_ids = a.in<std::int32_t>(find_spec(specs, "ids"), true);
  g.d_gates = a.in<float>(find_spec(specs, "gates"), true);
  if (lists(specs, "reroute_ids"))
    g.d_reroute_ids = a.in<std::int32_t>(find_spec(specs, "reroute_ids"), true);
  if (lists(specs, "token_priority"))
    g.d_token_priority = a.in<float>(find_spec(specs, "token_priority"), true);
  if (lists(specs, "second_skipped"))
    g.d_second_skipped = a.in<std::uint8_t>(find_spec(specs, "second_skipped"), true);
  return g;
}

/// The loss sums, as gating wrote them (`required` lists the ones the caller needs).
const_gating_sums sums_of(call_arrays& a, const routing_config& cfg, std::int64_t T, bool aux,
                          bool z, bool seq, const std::vector<spec>* given = nullptr) {
  const auto made = given != nullptr ? std::vector<spec>{} : gating_outputs(cfg, T, false);
  const auto& specs = given != nullptr ? *given : made;
  const_gating_sums s;
  s.d_valid_tokens = a.in<std::int64_t>(find_spec(specs, "valid_tokens"), false);
  s.d_aux_score_sum = a.in<double>(find_spec(specs, "aux_score_sum"), aux);
  s.d_aux_count = a.in<std::int64_t>(find_spec(specs, "aux_count"), aux);
  s.d_z_sum_squares = a.in<double>(find_spec(specs, "z_sum_squares"), z);
  if (cfg.loss.sequence_length > 0) {
    s.d_seq_score_sum = a.in<double>(find_spec(specs, "seq_score_sum"), seq);
    s.d_seq_count = a.in<std::int64_t>(find_spec(specs, "seq_count"), seq);
    s.d_seq_tokens = a.in<std::int64_t>(find_spec(specs, "seq_tokens"), seq);
  }
  return s;
}

cpu::executor executor_of(const run_on& r) {
  return r.threads == 1 ? cpu::executor::serial() : cpu::executor::openmp(r.threads);
}

/// The call's arrays, accepting device arrays when this build has the CUDA launchers.
call_arrays arrays_of(const char* op, py::dict arrays, std::optional<std::intptr_t> stream) {
  return call_arrays(op, std::move(arrays), stream, has_cuda());
}

/// Where the call runs: on the device of its arrays (read after the first array).
run_on where(const call_arrays& a, int threads, std::optional<std::intptr_t> stream) {
  return {a.place().type != dl::cpu || host_arrays_on_device(), threads, stream.value_or(0)};
}

}  // namespace

std::size_t gating_workspace_bytes(const routing_config& cfg, std::int64_t tokens, bool cuda) {
  raise_if(param_checks::validate_extents(cfg, tokens), "gating_workspace_bytes");
  return cuda ? cuda_launch::gating_workspace_bytes(cfg, tokens)
              : cpu::gating_workspace_bytes(cfg, tokens);
}

std::size_t dispatch_workspace_bytes(const routing_config& cfg, std::int64_t tokens, bool cuda) {
  raise_if(param_checks::validate_extents(cfg, tokens), "dispatch_workspace_bytes");
  return cuda ? cuda_launch::dispatch_workspace_bytes(cfg, tokens)
              : cpu::dispatch_workspace_bytes(cfg, tokens);
}

namespace {

// Each stage on a call's arrays (a dict's, or the fused route's presets); the fused route
// passes the output specs it made once (spec lists are most of a small call's cost).

void gating_on(const routing_config& cfg, call_arrays& a, float replay_ratio, int threads,
               std::optional<std::intptr_t> stream, const std::vector<spec>* given = nullptr) {
  raise_if(validate(cfg), "gating");
  const array_view logits = a.view("logits", {any, cfg.num_experts}, element_types, false);
  const run_on on = where(a, threads, stream);
  const std::int64_t T = logits.shape[0];
  raise_if(validate_tokens(cfg, T), "gating");
  const bool replayed = a.has("replay_ids");
  const auto made =
      given != nullptr
          ? std::vector<spec>{}
          : gating_outputs(cfg, T, a.has("aux_scores") || a.has("aux_count_ids"), replayed);
  const auto& specs = given != nullptr ? *given : made;
  gating_result o;
  o.d_ids = a.out<std::int32_t>(find_spec(specs, "ids"), true);
  o.d_gates = a.out<float>(find_spec(specs, "gates"), true);
  o.d_logsumexp = a.out<float>(find_spec(specs, "logsumexp"), false);
  o.sums.d_aux_score_sum = a.out<double>(find_spec(specs, "aux_score_sum"), true);
  o.sums.d_aux_count = a.out<std::int64_t>(find_spec(specs, "aux_count"), true);
  o.sums.d_valid_tokens = a.out<std::int64_t>(find_spec(specs, "valid_tokens"), true);
  o.sums.d_z_sum_squares =
      a.out<double>(find_spec(specs, "z_sum_squares"), cfg.loss.z_coefficient != 0.0f);
  o.sums.d_nonfinite = a.out<std::int64_t>(find_spec(specs, "nonfinite"), false);
  if (lists(specs, "reroute_ids"))
    o.d_reroute_ids = a.out<std::int32_t>(find_spec(specs, "reroute_ids"), true);
  if (cfg.loss.sequence_length > 0) {
    o.sums.d_seq_score_sum = a.out<double>(find_spec(specs, "seq_score_sum"), true);
    o.sums.d_seq_count = a.out<std::int64_t>(find_spec(specs, "seq_count"), true);
    o.sums.d_seq_tokens = a.out<std::int64_t>(find_spec(specs, "seq_tokens"), true);
  }
  if (lists(specs, "token_priority"))
    o.d_token_priority = a.out<float>(find_spec(specs, "token_priority"), true);
  if (lists(specs, "second_skipped"))
    o.d_second_skipped = a.out<std::uint8_t>(find_spec(specs, "second_skipped"), true);
  if (lists(specs, "aux_scores")) {
    o.d_aux_scores = a.out<float>(find_spec(specs, "aux_scores"), false);
    o.d_aux_count_ids = a.out<std::int32_t>(find_spec(specs, "aux_count_ids"), false);
  }
  gating_replay replay;
  replay.min_score_ratio = replay_ratio;
  if (replayed) {
    replay.d_ids = a.in<std::int32_t>({"replay_ids", {T, cfg.top_k}, elem::i32}, true);
    replay.d_replaced = a.out<std::int64_t>(find_spec(specs, "replay_replaced"), false);
    replay.d_invalid = a.out<std::int64_t>(find_spec(specs, "replay_invalid"), false);
  }
  const float* bias = a.in<float>({"bias", {cfg.num_experts}, elem::f32}, cfg.gating.expert_bias);
  const std::uint8_t* valid = valid_of(a, T);
  const std::size_t ws_bytes = gating_workspace_bytes(cfg, T, on.cuda);
  void* ws = workspace_of(a, ws_bytes);
  with_element(logits.dtype, [&](auto e) {
    using Element = decltype(e);
    gating_params<Element> p;
    p.d_logits = static_cast<const Element*>(logits.data);
    p.tokens = T;
    p.d_bias = bias;
    p.d_valid = valid;
    p.out = o;
    p.replay = replay;
    run("gating", [&] {
      return on.cuda ? cuda_launch::gating(cfg, p, ws, ws_bytes, on.stream)
                     : cpu::gating(cfg, p, ws, ws_bytes, executor_of(on));
    });
  });
}

void dispatch_on(const routing_config& cfg, call_arrays& a, int threads,
                 std::optional<std::intptr_t> stream, const std::vector<spec>* gspecs = nullptr,
                 const std::vector<spec>* given = nullptr) {
  raise_if(validate(cfg), "dispatch");
  const std::int64_t T = a.view("ids", {any, cfg.top_k}, {elem::i32}, false).shape[0];
  const run_on on = where(a, threads, stream);
  raise_if(validate_tokens(cfg, T), "dispatch");
  const auto made = given != nullptr ? std::vector<spec>{} : dispatch_outputs(cfg, T);
  const auto& specs = given != nullptr ? *given : made;
  dispatch_params p;
  p.tokens = T;
  p.gated = gated_of(a, cfg, T, gspecs);
  p.d_valid = valid_of(a, T);
  p.d_token_count = a.in<std::int64_t>({"token_count", {1}, elem::i64}, false);
  p.out.d_expert = a.out<std::int32_t>(find_spec(specs, "expert"), true);
  p.out.d_slot = a.out<std::int32_t>(find_spec(specs, "slot"), true);
  p.out.d_weight = a.out<float>(find_spec(specs, "weight"), true);
  p.out.d_fate = a.out<fate>(find_spec(specs, "fate"), true);
  p.out.d_requested = a.out<std::int64_t>(find_spec(specs, "requested"), true);
  p.out.d_kept = a.out<std::int64_t>(find_spec(specs, "kept"), true);
  p.out.d_rerouted = a.out<std::int64_t>(find_spec(specs, "rerouted"), true);
  p.out.d_dropped = a.out<std::int64_t>(find_spec(specs, "dropped"), true);
  p.out.d_received = a.out<std::int64_t>(find_spec(specs, "received"), true);
  p.out.d_load = a.out<std::int64_t>(find_spec(specs, "load"), true);
  p.out.d_totals = a.out<dispatch_totals>(find_spec(specs, "totals"), true);
  const std::size_t ws_bytes = dispatch_workspace_bytes(cfg, T, on.cuda);
  void* ws = workspace_of(a, ws_bytes);
  run("dispatch", [&] {
    return on.cuda ? cuda_launch::dispatch(cfg, p, ws, ws_bytes, on.stream)
                   : cpu::dispatch(cfg, p, ws, ws_bytes, executor_of(on));
  });
}

void layout_on(const routing_config& cfg, call_arrays& a, layout_kind kind, std::int64_t block_size,
               std::int32_t local_experts, int threads, std::optional<std::intptr_t> stream,
               const std::vector<spec>* given = nullptr,
               const std::vector<spec>* dgiven = nullptr) {
  raise_if(validate(cfg), "layout");
  const std::int64_t T = a.view("expert", {any, cfg.top_k}, {elem::i32}, false).shape[0];
  const run_on on = where(a, threads, stream);
  raise_if(validate_tokens(cfg, T), "layout");
  // the map may live on the device: the caller counts its local experts (its entries >= 0);
  // check_params checks local_experts against the config, the launcher the map against it
  const std::int32_t* map =
      a.in<std::int32_t>({"expert_map", {cfg.total_experts()}, elem::i32}, false);
  const std::int32_t local = map != nullptr ? local_experts : 0;
  if (map != nullptr && local < 1) a.fail("expert_map: holds no local expert (every entry is -1)");
  const auto made =
      given != nullptr ? std::vector<spec>{} : layout_outputs(cfg, T, kind, block_size, local);
  const auto& specs = given != nullptr ? *given : made;
  const auto dmade = dgiven != nullptr ? std::vector<spec>{} : dispatch_outputs(cfg, T);
  const auto& dspecs = dgiven != nullptr ? *dgiven : dmade;
  layout_params p;
  p.kind = kind;
  p.block_size = block_size;
  p.tokens = T;
  p.max_rows = find_spec(specs, "row_token").shape[0];
  p.dispatched.d_expert = a.in<std::int32_t>(find_spec(dspecs, "expert"), true);
  p.dispatched.d_slot = a.in<std::int32_t>(find_spec(dspecs, "slot"), true);
  p.dispatched.d_load = a.in<std::int64_t>(find_spec(dspecs, "load"), true);
  p.dispatched.d_totals = a.in<dispatch_totals>(find_spec(dspecs, "totals"), true);
  p.d_expert_map = map;
  p.local_experts = local;
  p.out.d_offsets = a.out<std::int64_t>(find_spec(specs, "offsets"), true);
  p.out.d_rows_used = a.out<std::int64_t>(find_spec(specs, "rows_used"), false);
  p.out.d_row_token = a.out<std::int32_t>(find_spec(specs, "row_token"), true);
  p.out.d_assignment_row = a.out<std::int64_t>(find_spec(specs, "assignment_row"), true);
  p.out.d_num_rows = a.out<std::int64_t>(find_spec(specs, "num_rows"), true);
  if (lists(specs, "block_expert"))
    p.out.d_block_expert = a.out<std::int32_t>(find_spec(specs, "block_expert"), false);
  if (lists(specs, "nonlocal"))
    p.out.d_nonlocal = a.out<std::int64_t>(find_spec(specs, "nonlocal"), true);
  run("layout", [&] {
    return on.cuda ? cuda_launch::layout(cfg, p, on.stream) : cpu::layout(cfg, p, executor_of(on));
  });
}

void losses_on(const routing_config& cfg, call_arrays& a, std::int64_t tokens, int threads,
               std::optional<std::intptr_t> stream, const std::vector<spec>* gspecs = nullptr) {
  raise_if(param_checks::validate_extents(cfg, tokens), "losses");
  loss_params p;
  p.tokens = tokens;
  p.d_aux_loss = a.out<double>({"aux_loss", {1}, elem::f64}, false);
  p.d_sequence_aux_loss = a.out<double>({"sequence_aux_loss", {1}, elem::f64}, false);
  p.d_z_loss = a.out<double>({"z_loss", {1}, elem::f64}, false);
  p.sums = sums_of(a, cfg, tokens, p.d_aux_loss != nullptr,
                   p.d_z_loss != nullptr && cfg.loss.z_coefficient != 0.0f,
                   p.d_sequence_aux_loss != nullptr, gspecs);
  const run_on on = where(a, threads, stream);
  run("losses", [&] {
    return on.cuda ? cuda_launch::losses(cfg, p, on.stream) : cpu::losses(cfg, p, executor_of(on));
  });
}

}  // namespace

void gating(routing_config cfg, py::dict arrays, float replay_ratio, int threads,
            std::optional<std::intptr_t> stream) {
  call_arrays a = arrays_of("gating", std::move(arrays), stream);
  gating_on(cfg, a, replay_ratio, threads, stream);
}

void dispatch(routing_config cfg, py::dict arrays, int threads,
              std::optional<std::intptr_t> stream) {
  call_arrays a = arrays_of("dispatch", std::move(arrays), stream);
  dispatch_on(cfg, a, threads, stream);
}

void layout(routing_config cfg, py::dict arrays, layout_kind kind, std::int64_t block_size,
            std::int32_t local_experts, int threads, std::optional<std::intptr_t> stream) {
  call_arrays a = arrays_of("layout", std::move(arrays), stream);
  layout_on(cfg, a, kind, block_size, local_experts, threads, stream);
}

void losses(routing_config cfg, py::dict arrays, std::int64_t tokens, int threads,
            std::optional<std::intptr_t> stream) {
  call_arrays a = arrays_of("losses", std::move(arrays), stream);
  losses_on(cfg, a, tokens, threads, stream);
}

namespace {

/// numpy's dtype of an output element type.
py::dtype numpy_dtype(elem e) {
  switch (e) {
    case elem::f16:
      return py::dtype("float16");
    case elem::f64:
      return py::dtype::of<double>();
    case elem::i32:
      return py::dtype::of<std::int32_t>();
    case elem::i64:
      return py::dtype::of<std::int64_t>();
    case elem::u8:
      return py::dtype::of<std::uint8_t>();
    default:
      return py::dtype::of<float>();
  }
}

std::size_t elem_bytes(elem e) {
  switch (e) {
    case elem::f16:
    case elem::bf16:
      return 2;
    case elem::f64:
    case elem::i64:
      return 8;
    case elem::u8:
      return 1;
    default:
      return 4;
  }
}

std::size_t bytes_of(const spec& s) {
  std::size_t n = elem_bytes(s.dtype);
  for (const std::int64_t d : s.shape) n *= static_cast<std::size_t>(d);
  return n;
}

/// Where route_host puts everything for one (config, T, layout, replay) call: the outputs'
/// specs by stage, each output's byte offset in the buffer, and the sizes (no Python objects:
/// a thread's plans outlive the interpreter). Made once and kept (route_host_plan_of): at
/// decode sizes making it was a third of the call.
struct route_host_plan {
  routing_config cfg;  // compared bit for bit: equal bits are an equal config (a miss else)
  std::int64_t T = 0, block_size = 0;
  layout_kind kind = layout_kind::padded;
  bool per_token_aux = false, replay = false, cuda = false;
  std::vector<spec> groups[4];
  std::vector<std::size_t> offsets[4];
  std::size_t gating_ws = 0, dispatch_ws = 0, ws_bytes = 0, total = 0;

  [[nodiscard]] bool matches(const routing_config& c, std::int64_t t, layout_kind k, std::int64_t b,
                             bool aux, bool r, bool on_device) const noexcept {
    return T == t && kind == k && block_size == b && per_token_aux == aux && replay == r &&
           cuda == on_device && std::memcmp(&cfg, &c, sizeof(routing_config)) == 0;
  }
};

/// The last few plans made (decode steps repeat one shape per layer config): a lookup compares
/// a handful of bytes. Per thread, so a call never sees another thread's half-made plan.
const route_host_plan& route_host_plan_of(const routing_config& cfg, std::int64_t T,
                                          layout_kind kind, std::int64_t block_size,
                                          bool per_token_aux, bool replay, bool cuda) {
  static_assert(std::is_trivially_copyable_v<routing_config>);
  constexpr std::size_t kept = 8;
  thread_local std::vector<std::unique_ptr<route_host_plan>> plans;  // most recent last
  for (std::size_t i = plans.size(); i-- > 0;)
    if (plans[i]->matches(cfg, T, kind, block_size, per_token_aux, replay, cuda)) {
      if (i + 1 != plans.size()) std::rotate(plans.begin() + i, plans.begin() + i + 1, plans.end());
      return *plans.back();
    }
  auto p = std::make_unique<route_host_plan>();
  std::memcpy(static_cast<void*>(&p->cfg), &cfg, sizeof(routing_config));
  p->T = T;
  p->kind = kind;
  p->block_size = block_size;
  p->per_token_aux = per_token_aux;
  p->replay = replay;
  p->cuda = cuda;
  p->groups[0] = gating_outputs(cfg, T, per_token_aux, replay);
  p->groups[1] = dispatch_outputs(cfg, T);
  p->groups[2] = layout_outputs(cfg, T, kind, block_size, 0);
  p->groups[3] = {{"aux_loss", {1}, elem::f64},
                  {"sequence_aux_loss", {1}, elem::f64},
                  {"z_loss", {1}, elem::f64}};
  p->gating_ws = gating_workspace_bytes(cfg, T, cuda);
  p->dispatch_ws = dispatch_workspace_bytes(cfg, T, cuda);
  const auto aligned = [](std::size_t n) { return align_up(n, 64); };
  p->ws_bytes = aligned(std::max(p->gating_ws, p->dispatch_ws));
  std::size_t at = p->ws_bytes;
  for (int g = 0; g < 4; ++g)
    for (const spec& s : p->groups[g]) {
      p->offsets[g].push_back(at);
      at += aligned(bytes_of(s));
    }
  p->total = at;
  if (plans.size() == kept) plans.erase(plans.begin());
  plans.push_back(std::move(p));
  return *plans.back();
}

}  // namespace

py::tuple route_host(routing_config cfg, py::object logits, py::object bias, py::object valid,
                     layout_kind kind, std::int64_t block_size, bool per_token_aux,
                     py::object replay_ids, float replay_ratio, int threads, py::object token_count,
                     py::object into, py::object into_losses) {
  py::dict given;
  given["logits"] = std::move(logits);
  given["bias"] = std::move(bias);
  given["valid"] = std::move(valid);
  given["replay_ids"] = std::move(replay_ids);
  given["token_count"] = std::move(token_count);
  call_arrays a("route", std::move(given), std::nullopt, false);
  raise_if(validate(cfg), "route");
  // the inputs read once, for every stage
  const array_view x = a.view("logits", {any, cfg.num_experts}, element_types, false);
  const std::int64_t T = x.shape[0];
  raise_if(validate_tokens(cfg, T), "route");
  a.preset("logits", x);
  if (a.has("valid")) a.preset("valid", a.view("valid", {T}, {elem::u8}, false));
  if (a.has("bias")) a.preset("bias", a.view("bias", {cfg.num_experts}, {elem::f32}, false));
  const run_on on = where(a, threads, std::nullopt);
  // every output, and the workspace the stages take in turn, carved from one buffer
  const route_host_plan& plan =
      route_host_plan_of(cfg, T, kind, block_size, per_token_aux, a.has("replay_ids"), on.cuda);
  const auto& groups = plan.groups;
  const std::size_t gating_ws = plan.gating_ws, dispatch_ws = plan.dispatch_ws;
  const auto buffer_bytes = static_cast<py::ssize_t>(plan.total + 64);
  const bool reuse = !into.is_none();
  py::array_t<std::uint8_t> buffer;
  float* losses_f32 = nullptr;
  double* losses_f64 = nullptr;
  if (reuse) {
    // an earlier call's buffer (the .base of its outputs), whose arrays the caller keeps:
    // written again in place, so no output object is made (moeroute.torch's route(out=))
    if (!py::isinstance<py::array_t<std::uint8_t>>(into))
      throw binding_error("route: into: not a uint8 numpy array (an earlier call's buffer)");
    buffer = py::reinterpret_borrow<py::array_t<std::uint8_t>>(into);
    // (the loss array is numpy's own, so its flags are right)
    const auto c_vector = [](const py::array& l) {
      return l.ndim() == 1 && l.shape(0) == 3 && (l.flags() & py::array::c_style) != 0 &&
             l.writeable();
    };
    if (py::isinstance<py::array_t<float>>(into_losses)) {
      auto l = py::reinterpret_borrow<py::array_t<float>>(into_losses);
      if (c_vector(l)) losses_f32 = l.mutable_data();
    } else if (py::isinstance<py::array_t<double>>(into_losses)) {
      auto l = py::reinterpret_borrow<py::array_t<double>>(into_losses);
      if (c_vector(l)) losses_f64 = l.mutable_data();
    }
    if (losses_f32 == nullptr && losses_f64 == nullptr)
      throw binding_error(
          "route: into_losses: a writable contiguous [3] float32 or float64 "
          "numpy array");
    // (not its flags' contiguity: pybind11 before 2.12 gives the arrays it makes under numpy
    // 2 the wrong strides, which nothing here reads)
    if (buffer.ndim() != 1 || buffer.shape(0) != buffer_bytes || !buffer.writeable())
      throw binding_error("route: into: " + std::to_string(buffer.size()) +
                          " bytes, not the writable buffer of " + std::to_string(buffer_bytes) +
                          " an earlier call with this config, batch and layout made");
  } else {
    buffer = py::array_t<std::uint8_t>(buffer_bytes);
  }
  auto* base = reinterpret_cast<std::byte*>(buffer.mutable_data());
  base += (64 - reinterpret_cast<std::uintptr_t>(base) % 64) % 64;
  // an empty batch writes nothing, and the losses only what the config has: zero first
  if (T == 0) std::fill(base + plan.ws_bytes, base + plan.total, std::byte{0});
  py::dict out[4];
  for (int g = 0; g < 4; ++g)
    for (std::size_t i = 0; i < groups[g].size(); ++i) {
      const spec& s = groups[g][i];
      std::byte* at = base + plan.offsets[g][i];
      if (g == 3) std::fill(at, at + bytes_of(s), std::byte{0});
      a.preset(s.name, array_view{at, s.dtype, s.shape, {dl::cpu, 0}});
      if (reuse) continue;
      // C-order strides from the element size: pybind11 before 2.12 reads a dtype's itemsize
      // at numpy 1's offset and made 0 strides under numpy 2
      std::vector<py::ssize_t> shape(s.shape.begin(), s.shape.end()), strides(shape.size());
      auto stride = static_cast<py::ssize_t>(elem_bytes(s.dtype));
      for (std::size_t d = shape.size(); d-- > 0;) {
        strides[d] = stride;
        stride *= shape[d];
      }
      out[g][py::str(s.name)] =
          py::array(numpy_dtype(s.dtype), std::move(shape), std::move(strides), at, buffer);
    }
  const auto workspace = [&](std::size_t bytes) {
    array_view v;
    v.data = base;
    v.dtype = elem::u8;
    v.shape = {static_cast<std::int64_t>(bytes)};
    a.preset("workspace", v);
  };
  workspace(gating_ws);
  gating_on(cfg, a, replay_ratio, threads, std::nullopt, &groups[0]);
  workspace(dispatch_ws);
  dispatch_on(cfg, a, threads, std::nullopt, &groups[0], &groups[1]);
  layout_on(cfg, a, kind, block_size, 0, threads, std::nullopt, &groups[2], &groups[1]);
  losses_on(cfg, a, T, threads, std::nullopt, &groups[0]);
  if (reuse) {  // the losses into the caller's [3] array (its loss tensors view it)
    double l[3];
    for (int i = 0; i < 3; ++i) std::memcpy(&l[i], base + plan.offsets[3][i], sizeof(double));
    if (losses_f32 != nullptr)
      for (int i = 0; i < 3; ++i) losses_f32[i] = static_cast<float>(l[i]);
    else
      std::copy(l, l + 3, losses_f64);
    return py::tuple();
  }
  return py::make_tuple(out[0], out[1], out[2], out[3]);
}

void permute(routing_config cfg, py::dict arrays, int threads,
             std::optional<std::intptr_t> stream) {
  call_arrays a = arrays_of("permute", std::move(arrays), stream);
  const array_view x = a.view("x", {any, any}, element_types, false);
  const run_on on = where(a, threads, stream);
  const array_view row_token = a.view("row_token", {any}, {elem::i32}, false);
  const std::int64_t T = x.shape[0], d = x.shape[1], rows = row_token.shape[0];
  const std::int64_t* num_rows = a.in<std::int64_t>({"num_rows", {1}, elem::i64}, false);
  const array_view out = a.view("out", {rows, d}, {x.dtype}, true);
  with_element(x.dtype, [&](auto e) {
    using Element = decltype(e);
    permute_params<Element> p;
    p.d_x = static_cast<const Element*>(x.data);
    p.tokens = T;
    p.hidden = d;
    p.layout.d_row_token = static_cast<const std::int32_t*>(row_token.data);
    p.layout.d_num_rows = num_rows;
    p.rows = rows;
    p.d_out = static_cast<Element*>(out.data);
    run("permute", [&] {
      return on.cuda ? cuda_launch::permute(cfg, p, on.stream)
                     : cpu::permute(cfg, p, executor_of(on));
    });
  });
}

void combine(routing_config cfg, py::dict arrays, int threads,
             std::optional<std::intptr_t> stream) {
  call_arrays a = arrays_of("combine", std::move(arrays), stream);
  const array_view expert_out = a.view("expert_out", {any, any}, element_types, false);
  const run_on on = where(a, threads, stream);
  const std::int64_t rows = expert_out.shape[0], d = expert_out.shape[1];
  const array_view weight = a.view("weight", {any, cfg.top_k}, {elem::f32}, false);
  const std::int64_t T = weight.shape[0];
  const bool residual = cfg.dispatch.dropped == drop_policy::residual;
  const auto* assignment_row =
      a.in<std::int64_t>({"assignment_row", {T, cfg.top_k}, elem::i64}, true);
  const auto* fates = a.in<fate>({"fate", {T, cfg.top_k}, elem::u8}, residual);
  const array_view y = a.view("y", {T, d}, {expert_out.dtype}, true);
  const void* x = residual ? a.view("x", {T, d}, {expert_out.dtype}, false).data : nullptr;
  with_element(expert_out.dtype, [&](auto e) {
    using Element = decltype(e);
    combine_params<Element> p;
    p.d_expert_out = static_cast<const Element*>(expert_out.data);
    p.rows = rows;
    p.tokens = T;
    p.hidden = d;
    p.layout.d_assignment_row = assignment_row;
    p.dispatched.d_weight = static_cast<const float*>(weight.data);
    p.dispatched.d_fate = fates;
    p.d_x = static_cast<const Element*>(x);
    p.d_y = static_cast<Element*>(y.data);
    run("combine", [&] {
      return on.cuda ? cuda_launch::combine(cfg, p, on.stream)
                     : cpu::combine(cfg, p, executor_of(on));
    });
  });
}

void gating_backward(routing_config cfg, py::dict arrays, const gating_backward_weights& weights,
                     bool accumulate, int threads, std::optional<std::intptr_t> stream) {
  call_arrays a = arrays_of("gating_backward", std::move(arrays), stream);
  raise_if(validate(cfg), "gating_backward");
  const array_view logits = a.view("logits", {any, cfg.num_experts}, element_types, false);
  const run_on on = where(a, threads, stream);
  const std::int64_t T = logits.shape[0];
  raise_if(validate_tokens(cfg, T), "gating_backward");
  const std::int64_t E = cfg.num_experts, k = cfg.top_k;
  const float* grad_weight = a.in<float>({"grad_weight", {T, k}, elem::f32}, false);
  const bool routing = grad_weight != nullptr && weights.routing != 0.0;
  const bool seq = cfg.loss.sequence_length > 0 && weights.sequence_aux != 0.0;
  const_gating_result g;
  g.d_ids = a.in<std::int32_t>({"ids", {T, k}, elem::i32}, routing);
  const auto specs = gating_outputs(cfg, T, false);
  g.sums.d_aux_count = a.in<std::int64_t>(find_spec(specs, "aux_count"), weights.aux != 0.0);
  g.sums.d_valid_tokens = a.in<std::int64_t>(find_spec(specs, "valid_tokens"), false);
  if (cfg.loss.sequence_length > 0) {
    g.sums.d_seq_count = a.in<std::int64_t>(find_spec(specs, "seq_count"), seq);
    g.sums.d_seq_tokens = a.in<std::int64_t>(find_spec(specs, "seq_tokens"), seq);
  }
  const_dispatch_result dres;
  dres.d_fate = a.in<fate>({"fate", {T, k}, elem::u8}, routing);
  float* grad_logits = a.out<float>({"grad_logits", {T, E}, elem::f32}, true);
  const std::uint8_t* valid = valid_of(a, T);
  with_element(logits.dtype, [&](auto e) {
    using Element = decltype(e);
    gating_backward_params<Element> p;
    p.d_logits = static_cast<const Element*>(logits.data);
    p.tokens = T;
    p.d_valid = valid;
    p.gated = g;
    p.dispatched = dres;
    p.d_grad_weight = grad_weight;
    p.weights = weights;
    p.accumulate = accumulate;
    p.d_grad_logits = grad_logits;
    run("gating_backward", [&] {
      return on.cuda ? cuda_launch::gating_backward(cfg, p, on.stream)
                     : cpu::gating_backward(cfg, p, executor_of(on));
    });
  });
}

void combine_backward(routing_config cfg, py::dict arrays, int threads,
                      std::optional<std::intptr_t> stream) {
  call_arrays a = arrays_of("combine_backward", std::move(arrays), stream);
  const array_view expert_out = a.view("expert_out", {any, any}, element_types, false);
  const run_on on = where(a, threads, stream);
  const std::int64_t rows = expert_out.shape[0], d = expert_out.shape[1];
  const array_view dy = a.view("dy", {any, d}, {expert_out.dtype}, false);
  const std::int64_t T = dy.shape[0], k = cfg.top_k;
  const auto* row_token = a.in<std::int32_t>({"row_token", {rows}, elem::i32}, true);
  const auto* assignment_row = a.in<std::int64_t>({"assignment_row", {T, k}, elem::i64}, true);
  const auto* weight = a.in<float>({"weight", {T, k}, elem::f32}, true);
  const auto* fates = a.in<fate>({"fate", {T, k}, elem::u8}, true);
  const array_view grad_expert_out = a.view("grad_expert_out", {rows, d}, {expert_out.dtype}, true);
  float* grad_weight = a.out<float>({"grad_weight", {T, k}, elem::f32}, true);
  void* grad_x =
      a.has("grad_x") ? a.view("grad_x", {T, d}, {expert_out.dtype}, true).data : nullptr;
  with_element(expert_out.dtype, [&](auto e) {
    using Element = decltype(e);
    combine_backward_params<Element> p;
    p.d_expert_out = static_cast<const Element*>(expert_out.data);
    p.d_dy = static_cast<const Element*>(dy.data);
    p.rows = rows;
    p.tokens = T;
    p.hidden = d;
    p.layout.d_row_token = row_token;
    p.layout.d_assignment_row = assignment_row;
    p.dispatched.d_weight = weight;
    p.dispatched.d_fate = fates;
    p.d_grad_expert_out = static_cast<Element*>(grad_expert_out.data);
    p.d_grad_weight = grad_weight;
    p.d_grad_x = static_cast<Element*>(grad_x);
    run("combine_backward", [&] {
      return on.cuda ? cuda_launch::combine_backward(cfg, p, on.stream)
                     : cpu::combine_backward(cfg, p, executor_of(on));
    });
  });
}

void permute_backward(routing_config cfg, py::dict arrays, bool accumulate, int threads,
                      std::optional<std::intptr_t> stream) {
  call_arrays a = arrays_of("permute_backward", std::move(arrays), stream);
  const array_view grad_buf = a.view("grad_buf", {any, any}, element_types, false);
  const run_on on = where(a, threads, stream);
  const std::int64_t rows = grad_buf.shape[0], d = grad_buf.shape[1];
  const array_view assignment_row = a.view("assignment_row", {any, cfg.top_k}, {elem::i64}, false);
  const std::int64_t T = assignment_row.shape[0];
  const array_view grad_x = a.view("grad_x", {T, d}, {grad_buf.dtype}, true);
  with_element(grad_buf.dtype, [&](auto e) {
    using Element = decltype(e);
    permute_backward_params<Element> p;
    p.d_grad_buf = static_cast<const Element*>(grad_buf.data);
    p.rows = rows;
    p.tokens = T;
    p.hidden = d;
    p.layout.d_assignment_row = static_cast<const std::int64_t*>(assignment_row.data);
    p.accumulate = accumulate;
    p.d_grad_x = static_cast<Element*>(grad_x.data);
    run("permute_backward", [&] {
      return on.cuda ? cuda_launch::permute_backward(cfg, p, on.stream)
                     : cpu::permute_backward(cfg, p, executor_of(on));
    });
  });
}

void expert_bias_update(routing_config cfg, py::dict arrays, std::optional<std::intptr_t> stream) {
  call_arrays a = arrays_of("expert_bias_update", std::move(arrays), stream);
  expert_bias_update_params p;
  p.d_bias = a.out<float>({"bias", {cfg.num_experts}, elem::f32}, true);
  const run_on on = where(a, 0, stream);
  p.d_load = a.in<std::int64_t>({"load", {cfg.num_experts}, elem::i64}, true);
  run("expert_bias_update", [&] {
    return on.cuda ? cuda_launch::expert_bias_update(cfg, p, on.stream)
                   : cpu::expert_bias_update(cfg, p);
  });
}

void token_mask(py::dict arrays, std::optional<std::intptr_t> stream) {
  call_arrays a = arrays_of("token_mask", std::move(arrays), stream);
  const array_view mask = a.view("mask", {any}, {elem::u8}, true);
  const run_on on = where(a, 0, stream);
  token_mask_params p;
  p.tokens = mask.shape[0];
  p.d_count = a.in<std::int64_t>({"token_count", {1}, elem::i64}, true);
  p.d_valid = valid_of(a, p.tokens);
  p.d_mask = static_cast<std::uint8_t*>(mask.data);
  run("token_mask",
      [&] { return on.cuda ? cuda_launch::token_mask(p, on.stream) : cpu::token_mask(p); });
}

}  // namespace moeroute::python
