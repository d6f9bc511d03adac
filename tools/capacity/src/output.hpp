// SPDX-License-Identifier: Apache-2.0
// moeroute-capacity, step 4 of 4 (write), what every mode shares: the --format output to stdout
// or --out, --csv beside it, and the plot drawn by a Python script.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "resources.hpp"

namespace moeroute::planner::tool {

inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'')
      q += "'\\''";
    else
      q += c;
  }
  return q + "'";
}

/// Runs `script OUT DATA` with `python` to draw a plot; removes DATA unless `keep_data`.
inline void draw_plot(const std::string& python, const std::string& script,
                      const std::string& plot_path, const std::string& data_path, bool keep_data) {
  const std::string cmd = shell_quote(python) + " " + shell_quote(script) + " " +
                          shell_quote(plot_path) + " " + shell_quote(data_path);
  const int rc = std::system(cmd.c_str());
  if (!keep_data) std::remove(data_path.c_str());
  if (rc != 0)
    throw std::runtime_error("plotting failed (" + cmd + " returned " + std::to_string(rc) +
                             "); needs python3 with matplotlib (Debian: python3-matplotlib)");
}

/// What every mode writes the same way: the --format output to stdout or --out, and --csv;
/// files are written whole or not at all (write_file_whole).
inline void write_outputs(const std::string& format, const std::string& out_path,
                          const std::string& csv_path,
                          const std::function<void(std::ostream&)>& table,
                          const std::function<void(std::ostream&)>& csv,
                          const std::function<std::string()>& json) {
  std::ostringstream main_out;
  if (format == "table")
    table(main_out);
  else if (format == "csv")
    csv(main_out);
  else
    main_out << json() << '\n';
  if (out_path.empty()) {
    std::cout << main_out.str();
  } else {
    write_file_whole(out_path, main_out.str(), "--out file");
  }
  if (!csv_path.empty()) {
    std::ostringstream c;
    csv(c);
    write_file_whole(csv_path, c.str(), "--csv file");
  }
}

}  // namespace moeroute::planner::tool
