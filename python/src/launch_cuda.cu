// SPDX-License-Identifier: Apache-2.0
// The CUDA launchers for the Python binding (launch.hpp): each takes the params struct with
// host element types and hands the same pointers, as __half / __nv_bfloat16, to the
// moeroute::cuda launcher on the caller's stream. Nothing here synchronises or allocates.
// The test module _core_emulated compiles this file with g++ against tests/emulation
// (MOEROUTE_EMULATION), which runs the same launchers' kernels on the CPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <moeroute/cuda.cuh>
#include <moeroute/dtype.hpp>

#include "launch.hpp"

namespace moeroute::python {

bool has_cuda() noexcept { return true; }

bool host_arrays_on_device() noexcept {
#if defined(MOEROUTE_EMULATION)
  return true;
#else
  return false;
#endif
}

}  // namespace moeroute::python

namespace moeroute::python::cuda_launch {

namespace {

template <class Host>
struct device_type {
  using type = float;
};
template <>
struct device_type<half_bits> {
  using type = __half;
};
template <>
struct device_type<bf16_bits> {
  using type = __nv_bfloat16;
};
template <class Host>
using device_t = typename device_type<Host>::type;

static_assert(sizeof(half_bits) == sizeof(__half) && sizeof(bf16_bits) == sizeof(__nv_bfloat16));

cudaStream_t stream_of(std::intptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

}  // namespace

std::size_t gating_workspace_bytes(const routing_config& cfg, std::int64_t tokens) {
  return cuda::gating_workspace_bytes(cfg, tokens);
}

std::size_t dispatch_workspace_bytes(const routing_config& cfg, std::int64_t tokens) {
  return cuda::dispatch_workspace_bytes(cfg, tokens);
}

template <class Element>
status gating(const routing_config& cfg, const gating_params<Element>& p, void* ws,
              std::size_t ws_bytes, std::intptr_t stream) {
  return cuda::gating(cfg, rebind<device_t<Element>>(p), ws, ws_bytes, stream_of(stream));
}

status dispatch(const routing_config& cfg, const dispatch_params& p, void* ws, std::size_t ws_bytes,
                std::intptr_t stream) {
  return cuda::dispatch(cfg, p, ws, ws_bytes, stream_of(stream));
}

status layout(const routing_config& cfg, const layout_params& p, std::intptr_t stream) {
  return cuda::layout(cfg, p, stream_of(stream));
}

template <class Element>
status permute(const routing_config& cfg, const permute_params<Element>& p, std::intptr_t stream) {
  return cuda::permute(cfg, rebind<device_t<Element>>(p), stream_of(stream));
}

template <class Element>
status combine(const routing_config& cfg, const combine_params<Element>& p, std::intptr_t stream) {
  return cuda::combine(cfg, rebind<device_t<Element>>(p), stream_of(stream));
}

status losses(const routing_config& cfg, const loss_params& p, std::intptr_t stream) {
  return cuda::losses(cfg, p, stream_of(stream));
}

template <class Element>
status gating_backward(const routing_config& cfg, const gating_backward_params<Element>& p,
                       std::intptr_t stream) {
  return cuda::gating_backward(cfg, rebind<device_t<Element>>(p), stream_of(stream));
}

template <class Element>
status combine_backward(const routing_config& cfg, const combine_backward_params<Element>& p,
                        std::intptr_t stream) {
  return cuda::combine_backward(cfg, rebind<device_t<Element>>(p), stream_of(stream));
}

template <class Element>
status permute_backward(const routing_config& cfg, const permute_backward_params<Element>& p,
                        std::intptr_t stream) {
  return cuda::permute_backward(cfg, rebind<device_t<Element>>(p), stream_of(stream));
}

status expert_bias_update(const routing_config& cfg, const expert_bias_update_params& p,
                          std::intptr_t stream) {
  return cuda::expert_bias_update(cfg, p, stream_of(stream));
}

status token_mask(const token_mask_params& p, std::intptr_t stream) {
  return cuda::token_mask(p, stream_of(stream));
}

MOEROUTE_PYTHON_LAUNCH_INSTANTIATE(float)
MOEROUTE_PYTHON_LAUNCH_INSTANTIATE(half_bits)
MOEROUTE_PYTHON_LAUNCH_INSTANTIATE(bf16_bits)

}  // namespace moeroute::python::cuda_launch
