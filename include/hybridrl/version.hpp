#pragma once
/// \file
/// The library version (kept equal to project(VERSION) in CMakeLists.txt; a test checks).

#define HYBRIDRL_VERSION_MAJOR 0
#define HYBRIDRL_VERSION_MINOR 1
#define HYBRIDRL_VERSION_PATCH 0
#define HYBRIDRL_VERSION_STRING "0.1.0"

namespace hybridrl {

/// "MAJOR.MINOR.PATCH" of the headers in use.
inline constexpr const char* version() noexcept { return HYBRIDRL_VERSION_STRING; }

}  // namespace hybridrl
