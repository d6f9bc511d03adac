// SPDX-License-Identifier: Apache-2.0
// Error codes shared by the CPU reference and the CUDA launchers.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace moeroute {

/// @brief Outcome of a validation or a launch. Launchers return it and never throw; the CPU
///        reference and the owning convenience layer throw `moeroute::error` carrying it.
enum class status_code : int {
  success = 0,
  invalid_config,       ///< a routing_config field is out of range or inconsistent
  invalid_shape,        ///< an extent is negative, too large, or inconsistent with the config
  invalid_argument,     ///< a null pointer with a non-zero extent, a wrong-length span, ...
  workspace_too_small,  ///< caller-provided workspace is smaller than workspace_bytes()
  unsupported,          ///< a combination this build does not implement
  cuda_error,           ///< a CUDA runtime call failed (the message carries cudaGetErrorString)
  /// Expert parallelism: ranks disagree (config, sizes), a peer reported bad input, a peer
  /// failed, or the transport (MPI, NCCL) returned an error. Every rank gets the same one.
  communication_error,
};

/// @brief A status plus a human-readable message that names the offending field and value.
///        Every function that returns one is [[nodiscard]] (validate(), the launchers, ...), so a
///        result cannot be dropped by accident. (Not the type itself: nvcc would then warn on
///        every `s = launcher(...)` reassignment, whose operator= returns a status&.)
struct status {
  status_code code = status_code::success;
  std::string message;

  [[nodiscard]] bool ok() const noexcept { return code == status_code::success; }
  explicit operator bool() const noexcept { return ok(); }

  [[nodiscard]] static status success() { return {}; }
  [[nodiscard]] static status make(status_code c, std::string msg) { return {c, std::move(msg)}; }
};

[[nodiscard]] inline const char* to_string(status_code c) noexcept {
  switch (c) {
    case status_code::success:
      return "success";
    case status_code::invalid_config:
      return "invalid_config";
    case status_code::invalid_shape:
      return "invalid_shape";
    case status_code::invalid_argument:
      return "invalid_argument";
    case status_code::workspace_too_small:
      return "workspace_too_small";
    case status_code::unsupported:
      return "unsupported";
    case status_code::cuda_error:
      return "cuda_error";
    case status_code::communication_error:
      return "communication_error";
  }
  return "unknown";
}

/// @brief Exception thrown by the CPU reference and the convenience layer.
class error : public std::runtime_error {
 public:
  explicit error(status s)
      : std::runtime_error(std::string("moeroute: ") + to_string(s.code) + ": " + s.message),
        status_(std::move(s)) {}
  [[nodiscard]] const moeroute::status& get_status() const noexcept { return status_; }

 private:
  moeroute::status status_;
};

/// @brief Throws `moeroute::error` when `s` is not ok.
inline void throw_if_error(const status& s) {
  if (!s.ok()) throw error(s);
}

}  // namespace moeroute
