# CMake helpers for projects that use hybridrl (installed with the package, and used by
# hybridrl's own build).
#
#   hybridrl_use_torch_pch(<target>)
#     Compiles <target> against a precompiled header of <torch/torch.h>, nlohmann-json and fmt,
#     built once per build tree (target hybridrl_torch_pch) and reused by every target that asks.
#     A LibTorch translation unit costs ~20 s of header parsing without it, ~3 s with it.
#     Set HYBRIDRL_USE_PCH=OFF to turn it off (e.g. to check include hygiene).
function(hybridrl_use_torch_pch target)
  if(DEFINED HYBRIDRL_USE_PCH AND NOT HYBRIDRL_USE_PCH)
    return()
  endif()
  if(NOT TARGET hybridrl_torch_pch)
    set(src "${CMAKE_BINARY_DIR}/hybridrl_torch_pch.cpp")
    file(CONFIGURE OUTPUT "${src}" CONTENT "// hybridrl: precompiled LibTorch headers\n")
    add_library(hybridrl_torch_pch OBJECT "${src}")
    target_link_libraries(hybridrl_torch_pch PUBLIC hybridrl::hybridrl)
    target_precompile_headers(hybridrl_torch_pch PRIVATE
      <torch/torch.h> <nlohmann/json.hpp> <fmt/format.h> <fmt/ranges.h>
      <map> <string> <vector> <memory> <functional>)
  endif()
  target_precompile_headers(${target} REUSE_FROM hybridrl_torch_pch)
endfunction()
