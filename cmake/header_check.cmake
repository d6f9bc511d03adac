# Header self-containment: one translation unit per public header that includes only it.
# .hpp files compile with the host compiler and moeroute::core alone (no CUDA include path);
# .cuh files compile with nvcc against moeroute::moeroute.
function(moeroute_add_header_checks)
  file(GLOB_RECURSE hpp RELATIVE ${PROJECT_SOURCE_DIR}/include CONFIGURE_DEPENDS
       ${PROJECT_SOURCE_DIR}/include/*.hpp)
  # Transport headers need their library: checked below against their own target.
  set(mpi_hpp ${hpp})
  list(FILTER hpp EXCLUDE REGEX "^moeroute/ep/mpi\\.hpp$")
  list(FILTER mpi_hpp INCLUDE REGEX "^moeroute/ep/mpi\\.hpp$")
  set(cpp_sources)
  foreach(h IN LISTS hpp)
    string(MAKE_C_IDENTIFIER "${h}" id)
    set(src ${CMAKE_CURRENT_BINARY_DIR}/header_check/${id}.cpp)
    file(GENERATE OUTPUT ${src} CONTENT "#include <${h}>\n#include <${h}>  // include guard\n")
    list(APPEND cpp_sources ${src})
  endforeach()
  add_library(moeroute_header_check_hpp OBJECT ${cpp_sources})
  # moeroute::core only: a CUDA header pulled in by a .hpp fails here.
  target_link_libraries(moeroute_header_check_hpp PRIVATE moeroute::core)
  target_compile_options(moeroute_header_check_hpp PRIVATE -Wall -Wextra -Wpedantic -Werror)

  if(MOEROUTE_HAS_MPI AND mpi_hpp)
    set(mpi_sources)
    foreach(h IN LISTS mpi_hpp)
      string(MAKE_C_IDENTIFIER "${h}" id)
      set(src ${CMAKE_CURRENT_BINARY_DIR}/header_check/${id}.cpp)
      file(GENERATE OUTPUT ${src} CONTENT "#include <${h}>\n#include <${h}>  // include guard\n")
      list(APPEND mpi_sources ${src})
    endforeach()
    add_library(moeroute_header_check_mpi OBJECT ${mpi_sources})
    target_link_libraries(moeroute_header_check_mpi PRIVATE moeroute::ep_mpi)
    target_compile_options(moeroute_header_check_mpi PRIVATE -Wall -Wextra -Wpedantic -Werror)
  endif()

  if(MOEROUTE_HAS_CUDA)
    file(GLOB_RECURSE cuh RELATIVE ${PROJECT_SOURCE_DIR} CONFIGURE_DEPENDS
         ${PROJECT_SOURCE_DIR}/include/*.cuh ${PROJECT_SOURCE_DIR}/kernels/*.cuh)
    set(cu_sources)
    foreach(h IN LISTS cuh)
      string(REGEX REPLACE "^(include|kernels)/" "" inc "${h}")
      string(MAKE_C_IDENTIFIER "${inc}" id)
      set(src ${CMAKE_CURRENT_BINARY_DIR}/header_check/${id}.cu)
      file(GENERATE OUTPUT ${src} CONTENT "#include <${inc}>\n#include <${inc}>  // include guard\n")
      list(APPEND cu_sources ${src})
    endforeach()
    if(cu_sources)
      add_library(moeroute_header_check_cuh OBJECT ${cu_sources})
      target_link_libraries(moeroute_header_check_cuh PRIVATE moeroute::moeroute)
      # one architecture is enough to prove a header compiles alone
      set_target_properties(moeroute_header_check_cuh PROPERTIES CUDA_ARCHITECTURES 90)
    endif()
  endif()
endfunction()
