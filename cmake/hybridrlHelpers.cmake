# CMake helpers for projects that use hybridrl (installed with the package, and used by
# hybridrl's own build).
#
#   hybridrl_optimize_at(<target> <level>)
#     Compiles <target> at -O<level> instead of the build type's level, except in Debug (GCC and
#     Clang; a no-op elsewhere). The shared precompiled header (built at the build type's level)
#     stays valid as long as both levels are ≥ 1: both define __OPTIMIZE__.
function(hybridrl_optimize_at target level)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE $<$<NOT:$<CONFIG:Debug>>:-O${level}>)
  endif()
endfunction()

#   hybridrl_use_torch_pch(<target>)
#     Compiles <target> against one precompiled header, built once per build tree (target
#     hybridrl_torch_pch) and reused by every target that asks: hybridrl's headers with the LibTorch
#     parts they include (ATen, torch/nn, autograd, c10d), nlohmann-json and fmt
#     (<hybridrl/detail/precompiled.hpp>). A translation unit that includes <hybridrl/hybridrl.hpp>
#     costs ~45 s without it and ~7 s with it (GCC 12, -O3); <torch/torch.h>'s other parts (jit,
#     optim, data) are not in it. Set HYBRIDRL_USE_PCH=OFF to turn it off (e.g. to check include
#     hygiene). In a build with hybridrl::cuda (call hybridrl_add_cuda_kernels() first), the header
#     and every target that uses it link hybridrl::cuda: a precompiled header serves only TUs with
#     its macros, and HYBRIDRL_HAS_CUDA_KERNELS, which hybridrl::cuda defines, changes what the
#     headers compile (GCC says "not used because `HYBRIDRL_HAS_CUDA_KERNELS' is defined" and parses
#     them all again otherwise).
function(hybridrl_use_torch_pch target)
  if(DEFINED HYBRIDRL_USE_PCH AND NOT HYBRIDRL_USE_PCH)
    return()
  endif()
  if(NOT TARGET hybridrl_torch_pch)
    set(src "${CMAKE_BINARY_DIR}/hybridrl_torch_pch.cpp")
    file(CONFIGURE OUTPUT "${src}" CONTENT "// hybridrl: precompiled hybridrl and LibTorch headers\n")
    add_library(hybridrl_torch_pch OBJECT "${src}")
    target_link_libraries(hybridrl_torch_pch PUBLIC hybridrl::hybridrl)
    if(TARGET hybridrl::cuda)
      target_link_libraries(hybridrl_torch_pch PUBLIC hybridrl::cuda)
    endif()
    target_precompile_headers(hybridrl_torch_pch PRIVATE
      <hybridrl/detail/precompiled.hpp> <nlohmann/json.hpp> <fmt/format.h> <fmt/ranges.h>
      <map> <string> <vector> <memory> <functional>)
  endif()
  if(TARGET hybridrl::cuda)
    # the LINK_LIBRARIES property, not target_link_libraries: that would refuse a target whose
    # other calls use the plain (keyword-less) signature
    set_property(TARGET ${target} APPEND PROPERTY LINK_LIBRARIES hybridrl::cuda)
  endif()
  target_precompile_headers(${target} REUSE_FROM hybridrl_torch_pch)
endfunction()

#   hybridrl_add_presets()
#     Defines hybridrl::presets (STATIC, once per build): the explicit instantiations of the preset
#     trainers of <hybridrl/trainer/presets.hpp> (PPOTrainer, GRPOTrainer, NaivePPOTrainer,
#     NaiveGRPOTrainer, DPOTrainer, KTOTrainer, SFTTrainer) and of their fit loops, and of
#     trainer/run.hpp's entry points for them (run_trainer, configure_run, help, read_run_data),
#     compiled once in this build from the source shipped with hybridrl (five files that build side
#     by side, ~50-60 s each at -O2). Targets that link it see HYBRIDRL_EXTERN_PRESETS and do not instantiate them again: a
#     program that trains a preset compiles in seconds. Call it after hybridrl_add_cuda_kernels()
#     where the build has CUDA: the presets then link hybridrl::cuda (their generation runs the
#     kernels, and every user of a preset must see the same HYBRIDRL_HAS_CUDA_KERNELS).
if(NOT HYBRIDRL_PRESETS_SOURCE_DIR)
  set(HYBRIDRL_PRESETS_SOURCE_DIR "${CMAKE_CURRENT_LIST_DIR}/../src/presets" CACHE INTERNAL "")
endif()
function(hybridrl_add_presets)
  if(TARGET hybridrl_presets)
    return()
  endif()
  file(GLOB srcs "${HYBRIDRL_PRESETS_SOURCE_DIR}/*.cpp")
  add_library(hybridrl_presets STATIC ${srcs})
  add_library(hybridrl::presets ALIAS hybridrl_presets)
  target_link_libraries(hybridrl_presets PUBLIC hybridrl::hybridrl)
  if(TARGET hybridrl::cuda)
    target_link_libraries(hybridrl_presets PUBLIC hybridrl::cuda)
  endif()
  target_compile_definitions(hybridrl_presets PUBLIC HYBRIDRL_EXTERN_PRESETS=1)
  hybridrl_use_torch_pch(hybridrl_presets)
  # -O2 under a release build's -O3: the fit loops are orchestration (their compute runs in
  # LibTorch and the CUDA kernels; a decode step's host work overlaps the GPU's), and -O3's extra
  # inlining cost a third more compile time (grpo.cpp 98 s at -O3, 63 s at -O2, GCC 12)
  hybridrl_optimize_at(hybridrl_presets 2)
endfunction()
