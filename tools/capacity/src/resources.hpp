// SPDX-License-Identifier: Apache-2.0
// moeroute-capacity's dealings with the operating system around a long dump: a SIGBUS handler
// (a mapped dump truncated, or its storage failing, while it is planned faults on the next
// page read: the tool says so and exits 2 instead of dying with "Bus error" and no message),
// the memory report the planning mode prints, and result files written whole or not at all.
#pragma once

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>

namespace moeroute::planner::tool {

/// On SIGBUS: one line on stderr, exit code 2. Nothing has been written by then: every mode
/// writes its results only after the planning finished (write_outputs).
inline void install_dump_fault_handler() {
  struct sigaction sa {};
  sa.sa_handler = [](int) {
    static const char msg[] =
        "moeroute-capacity: error: the mapped dump could not be read (SIGBUS: the file was "
        "truncated, or its storage failed, while it was being planned); no result was "
        "written\n";
    (void)!write(STDERR_FILENO, msg, sizeof msg - 1);  // async-signal-safe, unlike stdio
    _exit(2);
  };
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, nullptr);
}

/// The process's memory: the peak resident set (which counts the mapped dump's pages the
/// kernel has read in; it reclaims them under pressure) and the anonymous memory resident now
/// (the planner's own allocations, the part a memory limit must hold).
struct memory_use {
  std::int64_t peak_resident_bytes = 0;
  std::int64_t anonymous_bytes = 0;  ///< -1 where /proc/self/status has no RssAnon
};

inline memory_use current_memory_use() {
  memory_use m;
  struct rusage ru {};
  if (getrusage(RUSAGE_SELF, &ru) == 0) m.peak_resident_bytes = std::int64_t{ru.ru_maxrss} * 1024;
  m.anonymous_bytes = -1;
  std::ifstream status("/proc/self/status");
  std::string key;
  std::int64_t kib = 0;
  while (status >> key) {
    if (key == "RssAnon:" && status >> kib) {
      m.anonymous_bytes = kib * 1024;
      break;
    }
    status.ignore(1 << 20, '\n');
  }
  return m;
}

/// Writes `content` to `path` through `path.partial` and a rename, so a reader never sees a
/// half-written result (a full disk, a killed run).
inline void write_file_whole(const std::string& path, const std::string& content,
                             const char* what) {
  const std::string tmp = path + ".partial";
  {
    std::ofstream f(tmp, std::ios::binary);
    if (!(f << content) || !f.flush()) {
      std::remove(tmp.c_str());
      throw std::runtime_error(std::string("cannot write ") + what + " '" + path + "'");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw std::runtime_error(std::string("cannot write ") + what + " '" + path + "'");
  }
}

}  // namespace moeroute::planner::tool
