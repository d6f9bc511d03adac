# moeroute_dev_cuda_binary(target): the CUDA architectures (and, in a compile check, the
# optimisation) of one of moeroute's own GPU binaries — tests, examples, benchmarks, header
# checks — which run on one device (MOEROUTE_DEV_CUDA_ARCHITECTURES: the lent H200's sm_90).
#
# With MOEROUTE_GPU_COMPILE_CHECK (./build.sh test sets it when nvidia-smi finds no GPU) they
# are built only to prove they compile, which is all a machine without a device can use them
# for: PTX of the newest architecture (no ptxas), NVVM and the host compiler at -O0. What the
# optimised builds would add is checked elsewhere: ptxas and the resources of every routing
# kernel at -O3 (routing_kernel_resources), every configured architecture's SASS
# (example_cuda_gating), the test files' host code at -O1 with every warning as an error
# (cuda_tests_emulated compiles the same *_test.cu). The Python extension's launch_cuda.cu is
# one too in the top-level build (python/CMakeLists.txt; _core_emulated runs it), not in pip's.
# On a device the binaries still run, from PTX compiled at load time: correct but slow.
function(moeroute_dev_cuda_binary target)
  if(MOEROUTE_GPU_COMPILE_CHECK)
    list(GET MOEROUTE_DEV_CUDA_ARCHITECTURES -1 arch)
    string(REGEX REPLACE "-(real|virtual)$" "" arch "${arch}")
    set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES "${arch}-virtual")
    # cicc's own -O0: NVVM's optimisation, which a PTX nobody runs does not need (the host
    # code's -O0 comes from moeroute_dev_cuda_directory)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcicc=-O0>)
  else()
    set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES "${MOEROUTE_DEV_CUDA_ARCHITECTURES}")
  endif()
endfunction()

# moeroute_dev_cuda_directory(): in a compile check, the host code of every CUDA target of the
# calling directory (tests/, bench/, examples/: moeroute's own GPU binaries only) at -O0.
# Through the directory's flags: nvcc warns when a target's -O0 redefines the build type's -O3.
function(moeroute_dev_cuda_directory)
  if(MOEROUTE_GPU_COMPILE_CHECK)
    foreach(config RELEASE RELWITHDEBINFO MINSIZEREL)
      string(REGEX REPLACE "(^| )-O[0-9s]( |$)" "\\1-O0\\2" flags "${CMAKE_CUDA_FLAGS_${config}}")
      set(CMAKE_CUDA_FLAGS_${config} "${flags}" PARENT_SCOPE)
    endforeach()
  endif()
endfunction()
