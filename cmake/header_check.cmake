# Header self-containment: one translation unit per public header that includes only it.
# .hpp files compile with the host compiler and moeroute::core alone (no CUDA include path);
# .cuh files compile with nvcc against moeroute::moeroute; the transport headers
# (ep/mpi.hpp, ep/nccl.cuh) against their own targets.

# An OBJECT library `target` of one source per header (include paths relative to an include
# root), each including it twice, linked to `link`.
function(_moeroute_header_check target ext link)
  set(sources)
  foreach(inc IN LISTS ARGN)
    string(MAKE_C_IDENTIFIER "${inc}" id)
    set(src ${CMAKE_CURRENT_BINARY_DIR}/header_check/${id}.${ext})
    file(GENERATE OUTPUT ${src} CONTENT "#include <${inc}>\n#include <${inc}>  // include guard\n")
    list(APPEND sources ${src})
  endforeach()
  if(NOT sources)
    return()
  endif()
  add_library(${target} OBJECT ${sources})
  target_link_libraries(${target} PRIVATE ${link})
  if(ext STREQUAL "cu")
    # one architecture is enough to prove a header compiles alone
    moeroute_dev_cuda_binary(${target})
  else()
    target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Werror)
  endif()
endfunction()

function(moeroute_add_header_checks)
  file(GLOB_RECURSE hpp RELATIVE ${PROJECT_SOURCE_DIR}/include CONFIGURE_DEPENDS
       ${PROJECT_SOURCE_DIR}/include/*.hpp)
  set(mpi_hpp ${hpp})
  list(FILTER hpp EXCLUDE REGEX "^moeroute/ep/mpi\\.hpp$")
  list(FILTER mpi_hpp INCLUDE REGEX "^moeroute/ep/mpi\\.hpp$")
  # moeroute::core only: a CUDA header pulled in by a .hpp fails here.
  _moeroute_header_check(moeroute_header_check_hpp cpp moeroute::core ${hpp})
  # the planner's headers (tools/capacity) with its own target: standard library + core only
  file(GLOB_RECURSE planner_hpp RELATIVE ${PROJECT_SOURCE_DIR}/tools/capacity/include
       CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tools/capacity/include/*.hpp)
  _moeroute_header_check(moeroute_header_check_planner cpp moeroute::planner ${planner_hpp})
  if(MOEROUTE_HAS_MPI)
    _moeroute_header_check(moeroute_header_check_mpi cpp moeroute::ep_mpi ${mpi_hpp})
  endif()

  if(MOEROUTE_HAS_CUDA)
    file(GLOB_RECURSE cuh RELATIVE ${PROJECT_SOURCE_DIR} CONFIGURE_DEPENDS
         ${PROJECT_SOURCE_DIR}/include/*.cuh ${PROJECT_SOURCE_DIR}/kernels/*.cuh)
    list(TRANSFORM cuh REPLACE "^(include|kernels)/" "")
    set(nccl_cuh ${cuh})
    list(FILTER cuh EXCLUDE REGEX "^moeroute/ep/nccl\\.cuh$")
    list(FILTER nccl_cuh INCLUDE REGEX "^moeroute/ep/nccl\\.cuh$")
    _moeroute_header_check(moeroute_header_check_cuh cu moeroute::moeroute ${cuh})
    if(MOEROUTE_HAS_NCCL)
      _moeroute_header_check(moeroute_header_check_nccl cu moeroute::ep_nccl ${nccl_cuh})
    endif()
  endif()
endfunction()
