# cmake -P script: compiles SOURCE for one architecture (ARCH, e.g. 90) to CUBIN, writing
# ptxas' resource report (registers, stack frame, spills per kernel) to LOG. The build runs it
# (tests/CMakeLists.txt); bench/kernel_resources.py reads both files.
#   -DNVCC= -DARCH= -DSOURCE= -DCUBIN= -DLOG= -DINCLUDES=a;b [-DHOST_COMPILER=]
foreach(v NVCC ARCH SOURCE CUBIN LOG INCLUDES)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "kernel_resources.cmake: -D${v}= is required")
  endif()
endforeach()
string(REGEX REPLACE "-(real|virtual)$" "" ARCH "${ARCH}")
set(args -std=c++20 -arch=sm_${ARCH} -cubin --resource-usage -o ${CUBIN})
foreach(dir IN LISTS INCLUDES)
  list(APPEND args -I${dir})
endforeach()
if(HOST_COMPILER)
  list(APPEND args -ccbin ${HOST_COMPILER})
endif()
execute_process(COMMAND ${NVCC} ${args} ${SOURCE} OUTPUT_FILE ${LOG} ERROR_FILE ${LOG}
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  file(READ ${LOG} report)
  message(FATAL_ERROR "kernel_resources.cmake: nvcc failed (${rc}):\n${report}")
endif()
