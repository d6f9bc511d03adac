// SPDX-License-Identifier: Apache-2.0
// launch.hpp's CUDA side in a build without CUDA: never reached (call_arrays refuses device
// arrays there), each answers `unsupported` should it be.
#include "launch.hpp"

#include <moeroute/dtype.hpp>

namespace moeroute::python {
bool has_cuda() noexcept { return false; }
bool host_arrays_on_device() noexcept { return false; }
}  // namespace moeroute::python

namespace moeroute::python::cuda_launch {

namespace {
status none() {
  return status::make(status_code::unsupported, "this build of moeroute has no CUDA backend");
}
}  // namespace

std::size_t gating_workspace_bytes(const routing_config&, std::int64_t) { return 0; }
std::size_t dispatch_workspace_bytes(const routing_config&, std::int64_t) { return 0; }
template <class E>
status gating(const routing_config&, const gating_params<E>&, void*, std::size_t, std::intptr_t) {
  return none();
}
status dispatch(const routing_config&, const dispatch_params&, void*, std::size_t, std::intptr_t) {
  return none();
}
status layout(const routing_config&, const layout_params&, std::intptr_t) { return none(); }
template <class E>
status permute(const routing_config&, const permute_params<E>&, std::intptr_t) {
  return none();
}
template <class E>
status combine(const routing_config&, const combine_params<E>&, std::intptr_t) {
  return none();
}
status losses(const routing_config&, const loss_params&, std::intptr_t) { return none(); }
template <class E>
status gating_backward(const routing_config&, const gating_backward_params<E>&, std::intptr_t) {
  return none();
}
template <class E>
status combine_backward(const routing_config&, const combine_backward_params<E>&, std::intptr_t) {
  return none();
}
template <class E>
status permute_backward(const routing_config&, const permute_backward_params<E>&, std::intptr_t) {
  return none();
}
status expert_bias_update(const routing_config&, const expert_bias_update_params&, std::intptr_t) {
  return none();
}
status token_mask(const token_mask_params&, std::intptr_t) { return none(); }

MOEROUTE_PYTHON_LAUNCH_INSTANTIATE(float)
MOEROUTE_PYTHON_LAUNCH_INSTANTIATE(half_bits)
MOEROUTE_PYTHON_LAUNCH_INSTANTIATE(bf16_bits)

}  // namespace moeroute::python::cuda_launch
