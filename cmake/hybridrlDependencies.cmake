# Finds hybridrl's public dependencies and defines hybridrl::deps (an imported INTERFACE target
# that carries them). Included by the top-level CMakeLists.txt (HYBRIDRL_IN_CONFIG=OFF: a missing
# dependency is an error) and by the installed hybridrlConfig.cmake (HYBRIDRL_IN_CONFIG=ON:
# find_dependency, so find_package(hybridrl) fails cleanly and says which one is missing).
include(CMakeFindDependencyMacro)

macro(_hybridrl_dep name)
  if(HYBRIDRL_IN_CONFIG)
    find_dependency(${name} ${ARGN})
  else()
    find_package(${name} ${ARGN} REQUIRED)
  endif()
endmacro()

_hybridrl_dep(Torch)
_hybridrl_dep(nlohmann_json)
_hybridrl_dep(fmt)
# Eigen3 and range-v3: no hybridrl header uses them, so they are not required; when present they
# are linked into hybridrl::deps for code that wants them (HYBRIDRL_WITH_EIGEN / _RANGE_V3).
find_package(Eigen3 QUIET NO_MODULE)
find_package(range-v3 QUIET)
# sentencepiece (tokenizer/sentencepiece.hpp) is optional: only its header is needed at build time;
# the library is opened at run time (detail/sentencepiece_library.hpp says why). Debian ships a
# pkg-config file, other systems may not: the header is searched for directly too. When found,
# HYBRIDRL_WITH_SENTENCEPIECE=1 is defined for consumers; the umbrella header never includes it.
# -DHYBRIDRL_NO_SENTENCEPIECE=ON leaves it out even when installed.
set(HYBRIDRL_WITH_SENTENCEPIECE OFF)
if(NOT HYBRIDRL_NO_SENTENCEPIECE)
  find_package(PkgConfig QUIET)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(_hybridrl_spm QUIET sentencepiece)
  endif()
  find_path(HYBRIDRL_SENTENCEPIECE_INCLUDE_DIR sentencepiece_processor.h HINTS ${_hybridrl_spm_INCLUDE_DIRS})
  if(HYBRIDRL_SENTENCEPIECE_INCLUDE_DIR)
    set(HYBRIDRL_WITH_SENTENCEPIECE ON)
  endif()
endif()

# PCRE2 and ICU (optional) for tokenizer.json (tokenizer/hf_tokenizer.hpp): PCRE2 runs a
# pre-tokenizer's Split regex verbatim (\p{L}, (?i:...), lookahead; JIT), ICU the NFC/NFKC
# normalizers. Found through pkg-config (Debian: libpcre2-dev, libicu-dev); each defines
# HYBRIDRL_WITH_PCRE2=1 / HYBRIDRL_WITH_ICU=1. -DHYBRIDRL_NO_PCRE2=ON / -DHYBRIDRL_NO_ICU=ON leave
# them out. Without PCRE2 a tokenizer.json with a Split regex is refused with a message saying so.
set(HYBRIDRL_WITH_PCRE2 OFF)
set(HYBRIDRL_WITH_ICU OFF)
# xxHash (optional; Debian: libxxhash-dev): training checkpoints carry an XXH3 checksum of every
# tensor and of trainer_state.json, verified on load (HYBRIDRL_WITH_XXHASH=1; -DHYBRIDRL_NO_XXHASH=ON
# leaves it out, and checkpoints are then written and read without checksums).
set(HYBRIDRL_WITH_XXHASH OFF)
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  if(NOT HYBRIDRL_NO_PCRE2)
    pkg_check_modules(HYBRIDRL_PCRE2 QUIET IMPORTED_TARGET libpcre2-8)
    if(HYBRIDRL_PCRE2_FOUND)
      set(HYBRIDRL_WITH_PCRE2 ON)
    endif()
  endif()
  if(NOT HYBRIDRL_NO_ICU)
    pkg_check_modules(HYBRIDRL_ICU QUIET IMPORTED_TARGET icu-uc)
    if(HYBRIDRL_ICU_FOUND)
      set(HYBRIDRL_WITH_ICU ON)
    endif()
  endif()
  if(NOT HYBRIDRL_NO_XXHASH)
    pkg_check_modules(HYBRIDRL_XXHASH QUIET IMPORTED_TARGET libxxhash)
    if(HYBRIDRL_XXHASH_FOUND)
      set(HYBRIDRL_WITH_XXHASH ON)
    endif()
  endif()
endif()

# yaml-cpp (optional): core/options_yaml.hpp reads and writes Options as YAML when it is found.
find_package(yaml-cpp QUIET)
set(HYBRIDRL_WITH_YAML OFF)
if(TARGET yaml-cpp::yaml-cpp)
  set(HYBRIDRL_WITH_YAML ON)
  set(_hybridrl_yaml_target yaml-cpp::yaml-cpp)
elseif(TARGET yaml-cpp)
  set(HYBRIDRL_WITH_YAML ON)
  set(_hybridrl_yaml_target yaml-cpp)
endif()

# CUDA and NCCL: enabled only when LibTorch itself is a CUDA build and the toolkit is present.
set(HYBRIDRL_WITH_CUDA OFF)
set(HYBRIDRL_WITH_NCCL OFF)
if(TORCH_CUDA_LIBRARIES)
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(HYBRIDRL_WITH_CUDA ON)
    find_path(HYBRIDRL_NCCL_INCLUDE_DIR nccl.h
      HINTS ${HYBRIDRL_NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS}
      PATH_SUFFIXES include)
    find_library(HYBRIDRL_NCCL_LIBRARY NAMES nccl libnccl.so.2
      HINTS ${HYBRIDRL_NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR}
      PATH_SUFFIXES lib lib64)
    if(HYBRIDRL_NCCL_INCLUDE_DIR AND HYBRIDRL_NCCL_LIBRARY)
      set(HYBRIDRL_WITH_NCCL ON)
    endif()
  endif()
endif()

if(NOT TARGET hybridrl::deps)
  add_library(hybridrl::deps INTERFACE IMPORTED GLOBAL)
  # TORCH_LIBRARIES is recomputed on every machine, so the installed package stays relocatable.
  target_link_libraries(hybridrl::deps INTERFACE
    ${TORCH_LIBRARIES} nlohmann_json::nlohmann_json fmt::fmt-header-only ${CMAKE_DL_LIBS})
  if(TARGET Eigen3::Eigen)
    target_link_libraries(hybridrl::deps INTERFACE Eigen3::Eigen)
    target_compile_definitions(hybridrl::deps INTERFACE HYBRIDRL_WITH_EIGEN=1)
  endif()
  if(TARGET range-v3::range-v3)
    target_link_libraries(hybridrl::deps INTERFACE range-v3::range-v3)
    target_compile_definitions(hybridrl::deps INTERFACE HYBRIDRL_WITH_RANGE_V3=1)
  endif()
  # sentencepiece: headers only; the library is dlopen()ed in isolation at run time, because
  # Debian's copy exports a protobuf that clashes with LibTorch's (detail/sentencepiece_library.hpp).
  if(HYBRIDRL_WITH_YAML)
    target_compile_definitions(hybridrl::deps INTERFACE HYBRIDRL_WITH_YAML=1)
    target_link_libraries(hybridrl::deps INTERFACE ${_hybridrl_yaml_target})
  endif()
  if(HYBRIDRL_WITH_PCRE2)
    target_compile_definitions(hybridrl::deps INTERFACE HYBRIDRL_WITH_PCRE2=1)
    target_link_libraries(hybridrl::deps INTERFACE PkgConfig::HYBRIDRL_PCRE2)
  endif()
  if(HYBRIDRL_WITH_ICU)
    target_compile_definitions(hybridrl::deps INTERFACE HYBRIDRL_WITH_ICU=1)
    target_link_libraries(hybridrl::deps INTERFACE PkgConfig::HYBRIDRL_ICU)
  endif()
  if(HYBRIDRL_WITH_XXHASH)
    target_compile_definitions(hybridrl::deps INTERFACE HYBRIDRL_WITH_XXHASH=1)
    target_link_libraries(hybridrl::deps INTERFACE PkgConfig::HYBRIDRL_XXHASH)
  endif()
  if(HYBRIDRL_WITH_SENTENCEPIECE)
    target_include_directories(hybridrl::deps SYSTEM INTERFACE ${HYBRIDRL_SENTENCEPIECE_INCLUDE_DIR})
    target_compile_definitions(hybridrl::deps INTERFACE HYBRIDRL_WITH_SENTENCEPIECE=1)
  endif()
  if(HYBRIDRL_WITH_CUDA)
    target_compile_definitions(hybridrl::deps INTERFACE HYBRIDRL_WITH_CUDA=1)
    target_link_libraries(hybridrl::deps INTERFACE CUDA::cudart)
  endif()
  if(HYBRIDRL_WITH_NCCL)
    target_compile_definitions(hybridrl::deps INTERFACE HYBRIDRL_WITH_NCCL=1)
    target_include_directories(hybridrl::deps SYSTEM INTERFACE ${HYBRIDRL_NCCL_INCLUDE_DIR})
    target_link_libraries(hybridrl::deps INTERFACE ${HYBRIDRL_NCCL_LIBRARY})
  endif()
endif()
# Through add_subdirectory the imported targets found above (torch, torch_cpu, Eigen3::Eigen...)
# live in hybridrl's directory scope, and torch's refer to each other by name inside generator
# expressions; make every one of them global so the parent project's targets can see them.
if(NOT HYBRIDRL_IN_CONFIG AND NOT PROJECT_IS_TOP_LEVEL)
  get_directory_property(_hybridrl_imported IMPORTED_TARGETS)
  foreach(tgt ${_hybridrl_imported})
    get_target_property(_global ${tgt} IMPORTED_GLOBAL)
    if(NOT _global)
      set_target_properties(${tgt} PROPERTIES IMPORTED_GLOBAL TRUE)
    endif()
  endforeach()
endif()

if(NOT HYBRIDRL_IN_CONFIG)
  message(STATUS "hybridrl: LibTorch ${Torch_VERSION}, CUDA ${HYBRIDRL_WITH_CUDA}, NCCL ${HYBRIDRL_WITH_NCCL}, sentencepiece ${HYBRIDRL_WITH_SENTENCEPIECE}, YAML ${HYBRIDRL_WITH_YAML}, PCRE2 ${HYBRIDRL_WITH_PCRE2}, ICU ${HYBRIDRL_WITH_ICU}, xxHash ${HYBRIDRL_WITH_XXHASH}")
endif()
