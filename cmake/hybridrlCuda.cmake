# hybridrl's CUDA kernels ship as source and are compiled in the consumer's own build: no
# prebuilt binary, the consumer's CUDA architectures and toolkit (the CUTLASS way).
#
#   enable_language(CUDA)            # in your top-level CMakeLists.txt
#   hybridrl_add_cuda_kernels()      # defines hybridrl::cuda (STATIC), once per build
#   target_link_libraries(app PRIVATE hybridrl::hybridrl hybridrl::cuda)
#
# Linking hybridrl::cuda defines HYBRIDRL_HAS_CUDA_KERNELS, which switches functions such as
# write_kv_to_cache (<hybridrl/cuda/paged_kv.hpp>) from their LibTorch fallback to the kernel.
# A macro, not a function: the CUDA language must be enabled at the caller's file scope.
if(NOT HYBRIDRL_CUDA_SOURCE_DIR)
  set(HYBRIDRL_CUDA_SOURCE_DIR "${CMAKE_CURRENT_LIST_DIR}/../src/cuda" CACHE INTERNAL "")
endif()
macro(hybridrl_add_cuda_kernels)
  if(NOT TARGET hybridrl_cuda)
    if(NOT CMAKE_CUDA_COMPILER)
      message(FATAL_ERROR "hybridrl_add_cuda_kernels(): CUDA is not enabled. Call "
        "enable_language(CUDA) first (the CUDA toolkit's nvcc must be found).")
    endif()
    file(GLOB _hybridrl_cu "${HYBRIDRL_CUDA_SOURCE_DIR}/*.cu")
    add_library(hybridrl_cuda STATIC ${_hybridrl_cu})
    add_library(hybridrl::cuda ALIAS hybridrl_cuda)
    target_include_directories(hybridrl_cuda PRIVATE "${HYBRIDRL_CUDA_INCLUDE_DIR}")
    target_compile_features(hybridrl_cuda PRIVATE cuda_std_17)
    set_target_properties(hybridrl_cuda PROPERTIES POSITION_INDEPENDENT_CODE ON)
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      # LibTorch 2.x's CMake config sets CMAKE_CUDA_ARCHITECTURES to OFF (it reads
      # TORCH_CUDA_ARCH_LIST instead): an architecture given with -DCMAKE_CUDA_ARCHITECTURES is
      # still in the cache and wins; else the GPUs of this machine.
      if(DEFINED CACHE{CMAKE_CUDA_ARCHITECTURES} AND "$CACHE{CMAKE_CUDA_ARCHITECTURES}")
        set_target_properties(hybridrl_cuda PROPERTIES CUDA_ARCHITECTURES "$CACHE{CMAKE_CUDA_ARCHITECTURES}")
      else()
        set_target_properties(hybridrl_cuda PROPERTIES CUDA_ARCHITECTURES native)
      endif()
    endif()
    target_compile_definitions(hybridrl_cuda INTERFACE HYBRIDRL_HAS_CUDA_KERNELS=1)
  endif()
endmacro()
