# CMake before 3.26 does not know nvcc 12+'s C++20 dialect: its CUDA compile features stop at
# cuda_std_17, so `target_compile_features(... cuda_std_20)` fails to generate. Teach it the
# flag nvcc takes, so that the C++20 requirement of moeroute::moeroute travels as a compile
# feature (merged with a consumer's own CUDA_STANDARD into one -std flag) instead of a raw
# option that would clash with it. Included by moeroute's CMakeLists.txt and its package config;
# a no-op on a CMake that already knows.
if(CMAKE_CUDA_COMPILER_ID STREQUAL "NVIDIA" AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0
   AND NOT "cuda_std_20" IN_LIST CMAKE_CUDA_COMPILE_FEATURES)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_COMPILE_FEATURES cuda_std_20)
  list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
endif()
