// SPDX-License-Identifier: Apache-2.0
// The validation mode's one collective: every rank contributes its local status, and every
// rank then raises the same error (the lowest failing rank's, naming that rank) or none. Used
// before any data moves, so bad input on one rank is an error on all of them, never a hang.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <moeroute/ep/transport.hpp>
#include <moeroute/status.hpp>

namespace moeroute::ep::detail {

/// Fixed-size form of a status, so every rank sends the same number of bytes.
struct status_record {
  std::int32_t code = 0;
  std::int32_t op = 0;  // which collective the rank is in: ranks must call them in one order
  char message[240] = {};
};

inline status_record to_record(const status& s) {
  status_record r;
  r.code = static_cast<std::int32_t>(s.code);
  const std::size_t n = std::min(s.message.size(), sizeof(r.message) - 1);
  std::memcpy(r.message, s.message.data(), n);
  return r;
}

/// The data operations, so that ranks calling different ones (a collective-order bug that
/// would otherwise deadlock or mix buffers) get an error naming both.
enum class op : std::int32_t {
  make_plan = 1,
  dispatch,
  dispatch_sources,
  combine,
  dispatch_backward,
  combine_backward,
};
inline const char* op_name(std::int32_t o) {
  static const char* names[] = {
      "?",       "make_plan",         "dispatch",        "dispatch_sources",
      "combine", "dispatch_backward", "combine_backward"};
  return o >= 1 && o <= 6 ? names[o] : names[0];
}

/// Collective: throws on every rank when any rank's `local` is an error, or when ranks are in
/// different operations.
inline void agree(transport& t, const status& local, op what) {
  status_record mine = to_record(local);
  mine.op = static_cast<std::int32_t>(what);
  std::vector<status_record> all(static_cast<std::size_t>(t.ranks()));
  t.allgather(&mine, all.data(), sizeof(status_record));
  const std::string name = std::string("moeroute::ep::") + op_name(mine.op);
  for (std::size_t r = 0; r < all.size(); ++r)
    if (all[r].op != all[0].op)
      throw error(status::make(status_code::communication_error,
                               name + ": ranks are in different operations: rank 0 in " +
                                   op_name(all[0].op) + ", rank " + std::to_string(r) + " in " +
                                   op_name(all[r].op) + " (call them in the same order)"));
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].code == 0) continue;
    throw error(status::make(static_cast<status_code>(all[r].code),
                             name + ": rank " + std::to_string(r) + ": " + all[r].message));
  }
}

}  // namespace moeroute::ep::detail
