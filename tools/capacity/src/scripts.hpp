// SPDX-License-Identifier: Apache-2.0
// Where moeroute-capacity finds its plot scripts: installed beside the binary
// (<prefix>/bin/moeroute-capacity -> <prefix>/share/moeroute/capacity/), else in the source tree
// it was built from (MOEROUTE_SCRIPT_DIR, set by tools/capacity/CMakeLists.txt).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

#ifndef MOEROUTE_SCRIPT_DIR
#define MOEROUTE_SCRIPT_DIR "."
#endif
#ifndef MOEROUTE_PYTHON
#define MOEROUTE_PYTHON "python3"
#endif

namespace moeroute::planner::tool {

/// @brief The path of plot script `name` (plot_capacity.py, plot_ep.py, plot_plan.py).
inline std::string script_path(std::string_view name) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path installed =
        exe.parent_path().parent_path() / "share" / "moeroute" / "capacity" / fs::path(name);
    if (fs::is_regular_file(installed, ec)) return installed.string();
  }
  return (fs::path(MOEROUTE_SCRIPT_DIR) / fs::path(name)).string();
}

}  // namespace moeroute::planner::tool
