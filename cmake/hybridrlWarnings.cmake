# hybridrl::warnings — an INTERFACE target carrying the project's warning flags. Our own tests,
# examples, benches and apps link it; library users may link it too (it is exported). With
# HYBRIDRL_WERROR=ON (CI) every warning is an error.
option(HYBRIDRL_WERROR "Treat warnings in hybridrl's own targets as errors" OFF)
if(NOT TARGET hybridrl_warnings)
  add_library(hybridrl_warnings INTERFACE)
  add_library(hybridrl::warnings ALIAS hybridrl_warnings)
  set_target_properties(hybridrl_warnings PROPERTIES EXPORT_NAME warnings)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(hybridrl_warnings INTERFACE
      $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wshadow=local -Wnon-virtual-dtor
        -Wcast-align -Woverloaded-virtual -Wno-unused-parameter
        -Wno-missing-field-initializers>)  # aggregates with default member initializers
    if(HYBRIDRL_WERROR)
      target_compile_options(hybridrl_warnings INTERFACE $<BUILD_INTERFACE:$<$<COMPILE_LANGUAGE:CXX>:-Werror>>)
    endif()
  endif()
endif()
