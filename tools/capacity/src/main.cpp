// SPDX-License-Identifier: Apache-2.0
// moeroute-capacity: which capacity factor and drop policy for *my* traffic, and what does it
// cost? Routes router logits (a .npy file, a long memory-mapped dump, or a synthetic scenario)
// under every capacity factor x priority x drop policy, and prints drop rate, padding waste,
// load balance, buffer memory, losses and time per call as a table, CSV or JSON, plus a plot.
//
// Four steps, one file each: parse (cli.hpp), check (setup.hpp), load (inputs.hpp), then one
// mode plans and writes — the sweep (sweep_mode.hpp), --ep R (cluster_mode.hpp),
// --batch-tokens (planning_mode.hpp) or --agree A B (agree_mode.hpp, which loads its own two
// dumps). Before all that, the default build hands over to the build for the CPU's vector level
// (isa_dispatch.hpp). The planning itself is the moeroute::planner library
// (tools/capacity/include), which the Python package binds too.
//
// Exit codes: 0 success, 2 bad arguments or a malformed .npy file (also one truncated while it
// is read), 1 anything else.
#include <iostream>
#include <optional>

#include <moeroute/status.hpp>

#include "agree_mode.hpp"
#include "cli.hpp"
#include "cluster_mode.hpp"
#include "inputs.hpp"
#include "isa_dispatch.hpp"
#include "planning_mode.hpp"
#include "resources.hpp"
#include "setup.hpp"
#include "sweep_mode.hpp"

namespace {

using namespace moeroute::planner::tool;

int run(int argc, char** argv) {
  run_best_isa_build(argv);  // the default build execs the one for this CPU's vector level
  tool_options o;
  if (const std::optional<int> done = parse_command_line(argc, argv, o)) return *done;
  tool_setup s = check_options(o);
  if (!o.agree.empty()) return run_agree_mode(o, s);
  tool_inputs in;
  load_inputs(o, s, in);
  if (o.planning) return run_planning_mode(o, s, in);
  if (o.ep_ranks != 0) return run_cluster_mode(o, s, in);
  return run_sweep_mode(o, s, in);
}

}  // namespace

int main(int argc, char** argv) {
  install_dump_fault_handler();  // a dump truncated under the mapping: exit 2, not "Bus error"
  try {
    return run(argc, argv);
  } catch (const usage_error& e) {
    std::cerr << "moeroute-capacity: error: " << e.what() << "\n";
    return 2;
  } catch (const moeroute::error& e) {
    std::cerr << "moeroute-capacity: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "moeroute-capacity: error: " << e.what() << "\n";
    return 1;
  }
}
