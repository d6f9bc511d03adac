// SPDX-License-Identifier: Apache-2.0
// One moeroute-capacity for every x86-64 machine. The CPU backend's vector paths are fixed when
// it is compiled (include/moeroute/cpu/isa.hpp), so the tool is built once per level:
// moeroute-capacity for the compiler's default target, and beside it moeroute-capacity-avx2
// (x86-64-v3) and moeroute-capacity-avx512 (x86-64-v4) — in the build tree next to it, once
// installed in libexec/moeroute. The default build starts by replacing itself (execv, same
// arguments) with the highest level the CPU runs and the install has; the choice changes speed,
// never the plan (ids and counts are the same on every level; numerics.md).
//
// MOEROUTE_ISA=baseline|avx2|avx512 asks for a level (the Python package reads the same
// variable); one that is unknown, beyond this CPU or not installed is an error (exit 2), never
// a silent fallback.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>

#include <moeroute/cpu/isa.hpp>

#include "cli.hpp"

#ifndef MOEROUTE_TOOL_LIBEXEC_FROM_BIN
#define MOEROUTE_TOOL_LIBEXEC_FROM_BIN "../libexec/moeroute"
#endif

namespace moeroute::planner::tool {

/// The build of `level` beside this executable (build tree) or in libexec (install), if any.
inline std::optional<std::filesystem::path> isa_build_path(cpu::isa_level level) {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return std::nullopt;  // not Linux: the default build runs
  const std::string name = "moeroute-capacity-" + std::string(cpu::isa_name(level));
  for (const std::filesystem::path& dir :
       {self.parent_path(), self.parent_path() / MOEROUTE_TOOL_LIBEXEC_FROM_BIN}) {
    const std::filesystem::path p = dir / name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return std::nullopt;
}

/// @brief In the default build: execs the build for MOEROUTE_ISA or the CPU's best level; returns
///        when this build is the one to run. Throws usage_error for a bad MOEROUTE_ISA.
inline void run_best_isa_build(char** argv) {
  if constexpr (cpu::compiled_isa() != cpu::isa_level::baseline) return;  // a level's build
  const cpu::isa_level host = cpu::host_isa();
  const char* asked_text = std::getenv("MOEROUTE_ISA");
  std::optional<std::filesystem::path> target;
  if (asked_text != nullptr && *asked_text != '\0') {
    const std::optional<cpu::isa_level> asked = cpu::parse_isa(asked_text);
    if (!asked)
      throw usage_error(std::string("MOEROUTE_ISA='") + asked_text +
                        "': expected one of baseline, avx2, avx512");
    if (static_cast<int>(*asked) > static_cast<int>(host))
      throw usage_error(std::string("MOEROUTE_ISA=") + asked_text + ": this CPU runs at most " +
                        std::string(cpu::isa_name(host)));
    if (*asked == cpu::isa_level::baseline) return;
    target = isa_build_path(*asked);
    if (!target)
      throw usage_error(std::string("MOEROUTE_ISA=") + asked_text + ": no moeroute-capacity-" +
                        asked_text + " beside this moeroute-capacity or in its libexec/moeroute");
  } else {
    for (int l = static_cast<int>(host); l > 0 && !target; --l)
      target = isa_build_path(static_cast<cpu::isa_level>(l));
    if (!target) return;
  }
  ::execv(target->c_str(), argv);
  // only reached when the exec failed
  throw usage_error("cannot run " + target->string() + ": " + std::strerror(errno) +
                    " (MOEROUTE_ISA=baseline runs this build)");
}

}  // namespace moeroute::planner::tool
