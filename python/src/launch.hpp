// SPDX-License-Identifier: Apache-2.0
// Where one binding call runs, and the launch of each stage there: the CPU backend with an
// OpenMP thread cap, or (in a module built with launch_cuda.cu) the CUDA launchers on the
// caller's stream. The CUDA side is defined in launch_cuda.cu, the only file nvcc compiles:
// this header and the bindings stay plain C++ (the params structs take the host element types
// half_bits / bf16_bits, which launch_cuda.cu reinterprets as __half / __nv_bfloat16, the same
// bits).
#pragma once

#include <cstddef>
#include <cstdint>

#include <moeroute/config.hpp>
#include <moeroute/params/combine.hpp>
#include <moeroute/params/combine_backward.hpp>
#include <moeroute/params/dispatch.hpp>
#include <moeroute/params/expert_bias_update.hpp>
#include <moeroute/params/gating.hpp>
#include <moeroute/params/gating_backward.hpp>
#include <moeroute/params/layout.hpp>
#include <moeroute/params/losses.hpp>
#include <moeroute/params/permute.hpp>
#include <moeroute/params/permute_backward.hpp>
#include <moeroute/params/token_mask.hpp>
#include <moeroute/status.hpp>

namespace moeroute::python {

/// Where a call runs: the CPU (threads: OpenMP cap, 0 = default, 1 = serial) or a CUDA stream.
struct run_on {
  bool cuda = false;
  int threads = 0;
  std::intptr_t stream = 0;  ///< cudaStream_t of the caller (torch's current stream)
};

/// True when this module has the CUDA launchers (launch_cuda.cu, not launch_cpu_only.cpp).
[[nodiscard]] bool has_cuda() noexcept;

/// True only in the test module moeroute._core_emulated: launch_cuda.cu compiled against the
/// CPU lock-step emulation (tests/emulation), where device memory is host memory, so every
/// call runs the CUDA launchers on host arrays.
[[nodiscard]] bool host_arrays_on_device() noexcept;

namespace cuda_launch {
// Defined in launch_cuda.cu for Element = float, half_bits, bf16_bits; each is the
// moeroute::cuda launcher of the same name on `stream` (asynchronous, no allocation).
[[nodiscard]] std::size_t gating_workspace_bytes(const routing_config& cfg, std::int64_t tokens);
[[nodiscard]] std::size_t dispatch_workspace_bytes(const routing_config& cfg, std::int64_t tokens);
template <class Element>
[[nodiscard]] status gating(const routing_config& cfg, const gating_params<Element>& p, void* ws,
                            std::size_t ws_bytes, std::intptr_t stream);
[[nodiscard]] status dispatch(const routing_config& cfg, const dispatch_params& p, void* ws,
                              std::size_t ws_bytes, std::intptr_t stream);
[[nodiscard]] status layout(const routing_config& cfg, const layout_params& p,
                            std::intptr_t stream);
template <class Element>
[[nodiscard]] status permute(const routing_config& cfg, const permute_params<Element>& p,
                             std::intptr_t stream);
template <class Element>
[[nodiscard]] status combine(const routing_config& cfg, const combine_params<Element>& p,
                             std::intptr_t stream);
[[nodiscard]] status losses(const routing_config& cfg, const loss_params& p, std::intptr_t stream);
template <class Element>
[[nodiscard]] status gating_backward(const routing_config& cfg,
                                     const gating_backward_params<Element>& p,
                                     std::intptr_t stream);
template <class Element>
[[nodiscard]] status combine_backward(const routing_config& cfg,
                                      const combine_backward_params<Element>& p,
                                      std::intptr_t stream);
template <class Element>
[[nodiscard]] status permute_backward(const routing_config& cfg,
                                      const permute_backward_params<Element>& p,
                                      std::intptr_t stream);
[[nodiscard]] status expert_bias_update(const routing_config& cfg,
                                        const expert_bias_update_params& p, std::intptr_t stream);
[[nodiscard]] status token_mask(const token_mask_params& p, std::intptr_t stream);
}  // namespace cuda_launch

/// The element-typed launches a launch file defines, instantiated for one element type (used
/// inside namespace cuda_launch of launch_cuda.cu and launch_cpu_only.cpp).
#define MOEROUTE_PYTHON_LAUNCH_INSTANTIATE(E)                                                   \
  template status gating<E>(const routing_config&, const gating_params<E>&, void*, std::size_t, \
                            std::intptr_t);                                                     \
  template status permute<E>(const routing_config&, const permute_params<E>&, std::intptr_t);   \
  template status combine<E>(const routing_config&, const combine_params<E>&, std::intptr_t);   \
  template status gating_backward<E>(const routing_config&, const gating_backward_params<E>&,   \
                                     std::intptr_t);                                            \
  template status combine_backward<E>(const routing_config&, const combine_backward_params<E>&, \
                                      std::intptr_t);                                           \
  template status permute_backward<E>(const routing_config&, const permute_backward_params<E>&, \
                                      std::intptr_t);

}  // namespace moeroute::python
