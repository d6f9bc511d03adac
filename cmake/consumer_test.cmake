# Builds and runs examples/consumer against moeroute, either through an installed prefix
# (MODE=find_package) or with add_subdirectory (MODE=add_subdirectory): its CPU program, and
# with HAS_CUDA its .cu against moeroute::moeroute. Run with cmake -P.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
if(NOT HAS_CUDA)
  set(cuda_flag -DMOEROUTE_ENABLE_CUDA=OFF)
endif()

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message("${out}")
endfunction()

if(MODE STREQUAL "find_package")
  # install moeroute alone (no tests) into a private prefix, then build the consumer against it
  run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/moeroute-build -G ${GENERATOR}
      -DMOEROUTE_BUILD_TESTS=OFF -DMOEROUTE_BUILD_BENCHMARKS=OFF -DMOEROUTE_BUILD_EXAMPLES=OFF
      -DMOEROUTE_BUILD_PYTHON=OFF ${cuda_flag} -DCMAKE_INSTALL_PREFIX=${WORK_DIR}/prefix)
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/moeroute-build)
  run(${CMAKE_COMMAND} --install ${WORK_DIR}/moeroute-build)
  # the installed planner CLI (built without Google Benchmark: benchmarks are off above) finds
  # its installed plot scripts, not the source tree's
  if(EXISTS ${WORK_DIR}/prefix/bin/moeroute-capacity)
    foreach(script IN ITEMS plot_capacity.py plot_ep.py plot_plan.py)
      if(NOT EXISTS ${WORK_DIR}/prefix/share/moeroute/capacity/${script})
        message(FATAL_ERROR "the install has no share/moeroute/capacity/${script}")
      endif()
    endforeach()
    run(${WORK_DIR}/prefix/bin/moeroute-capacity --scenario zipf --tokens 64 --experts 8
        --factors 1.0,dropless --format csv --quiet)
    # the installed tool hands over to its build for this CPU's level in libexec/moeroute
    execute_process(COMMAND ${WORK_DIR}/prefix/bin/moeroute-capacity --version
                    OUTPUT_VARIABLE version RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0 OR NOT version MATCHES "\\(([a-z0-9]+) build; this CPU runs ([a-z0-9]+)\\)")
      message(FATAL_ERROR "moeroute-capacity --version: ${rc} ${version}")
    endif()
    if(EXISTS ${WORK_DIR}/prefix/libexec/moeroute/moeroute-capacity-${CMAKE_MATCH_2} AND
       NOT CMAKE_MATCH_1 STREQUAL CMAKE_MATCH_2)
      message(FATAL_ERROR "the installed tool ran its ${CMAKE_MATCH_1} build on a "
                          "${CMAKE_MATCH_2} CPU: ${version}")
    endif()
  else()
    message(FATAL_ERROR "the install has no bin/moeroute-capacity")
  endif()
  run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/consumer -B ${WORK_DIR}/consumer-build -G ${GENERATOR}
      -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix ${cuda_flag})
else()
  set(HAS_CUDA OFF)
  run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/consumer -B ${WORK_DIR}/consumer-build -G ${GENERATOR}
      -DMOEROUTE_SOURCE_DIR=${SOURCE_DIR} -DMOEROUTE_ENABLE_CUDA=OFF)
endif()
run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer-build)
run(${WORK_DIR}/consumer-build/moeroute_consumer)
run(${WORK_DIR}/consumer-build/moeroute_consumer_planner)
if(HAS_CUDA)
  # the .cu against moeroute::moeroute: built, and run (without a device it checks the
  # launchers' host-side contract and says the launch was not run)
  run(${WORK_DIR}/consumer-build/moeroute_consumer_cuda)
endif()
