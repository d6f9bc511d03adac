// SPDX-License-Identifier: Apache-2.0
// The expert-parallel suite under MPI: started by ctest as `mpiexec -n R ep_mpi_tests`, every
// process runs every check of tests/common/ep_cases.hpp for its rank (the same bodies as the
// loopback tests). Exit 0 only when every rank passed every check; ctest's TIMEOUT turns a
// hang into a failure.
#include <cstdio>
#include <exception>

#include <moeroute/ep/mpi.hpp>  // brings <mpi.h>, C API only

#include "../common/ep_cases.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int failed = 0, checks = 0;
  {
    moeroute::ep::mpi_transport t(MPI_COMM_WORLD);
    for (const auto& c : moeroute::test::ep_oracle::all_checks(t.ranks())) {
      ++checks;
      std::vector<std::string> failures;
      try {
        failures = c.run(t);
      } catch (const std::exception& e) {
        failures.push_back(c.name + ": unexpected exception: " + e.what());
      }
      for (const auto& f : failures)
        std::fprintf(stderr, "FAIL rank %d: %s\n", t.rank(), f.c_str());
      failed += failures.empty() ? 0 : 1;
    }
    int any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_SUM, t.comm());
    if (t.rank() == 0)
      std::printf("ep_mpi_tests: %d ranks, %d checks, %s\n", t.ranks(), checks,
                  any ? "FAILED" : "all passed on every rank");
    failed = any;
  }
  MPI_Finalize();
  return failed ? 1 : 0;
}
