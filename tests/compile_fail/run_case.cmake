# Compiles one compile-fail source with the exact command CMake generated for it (read from
# compile_commands.json), so every case runs as its own ctest entry, in parallel, without a
# `cmake --build` of the shared build tree. Variables:
#   COMMANDS  path of compile_commands.json      SOURCE  the source file to compile
#   MODE      ok (must compile) | fail (must not compile, output must match EXPECT, not REJECT)
#   EXPECT    regex the compiler output must match (fail mode)
#   REJECT    optional regex the output must NOT match (e.g. a second rule's message)
# A failing case stops at its first error (-Wfatal-errors): that error must be the expected
# message, and the compile takes ~0.1 s instead of ~9 (the headers' deferred instantiations, redone
# in every TU, come after it). With COMPILE_FAIL_FULL=1 in the environment (`./scripts/test.sh
# --lint`, which `.ci/run` calls; not HYBRIDRL_-prefixed, since `hybridrl train` reads HYBRIDRL_*
# variables as configuration keys) it compiles to the end, and the whole output is checked:
# nothing matches REJECT, and at most one static_assert fires.
file(READ ${COMMANDS} db)
string(JSON n LENGTH "${db}")
math(EXPR last "${n} - 1")
set(command "")
foreach(i RANGE ${last})
  string(JSON file GET "${db}" ${i} file)
  if(file STREQUAL SOURCE)
    string(JSON command GET "${db}" ${i} command)
    string(JSON dir GET "${db}" ${i} directory)
    break()
  endif()
endforeach()
if(NOT command)
  message(FATAL_ERROR "no compile command for ${SOURCE} in ${COMMANDS}")
endif()
separate_arguments(args UNIX_COMMAND "${command}")
# The object is not needed: compile to a throw-away file.
list(FIND args "-o" o)
if(o GREATER -1)
  math(EXPR oi "${o} + 1")
  list(REMOVE_AT args ${oi})
  list(INSERT args ${oi} "${CMAKE_CURRENT_BINARY_DIR}/cf_throwaway_${MODE}_${CASE}.o")
endif()
set(full "$ENV{COMPILE_FAIL_FULL}")
if(MODE STREQUAL "fail" AND NOT full)
  list(APPEND args -Wfatal-errors)  # last: the command may start with a launcher (ccache)
endif()
execute_process(COMMAND ${args} WORKING_DIRECTORY ${dir} RESULT_VARIABLE rc
  OUTPUT_VARIABLE out ERROR_VARIABLE out)
message("${out}")
if(MODE STREQUAL "ok")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${SOURCE} must compile as written (the case without its mistake), but did not")
  endif()
  return()
endif()
if(rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled with HYBRIDRL_COMPILE_FAIL, but must not")
endif()
if(NOT out MATCHES "${EXPECT}")
  message(FATAL_ERROR "the compiler failed, but without the expected message: ${EXPECT}")
endif()
if(REJECT AND out MATCHES "${REJECT}")
  message(FATAL_ERROR "the compiler also printed a message that must not appear: ${REJECT}")
endif()
# Only the first broken rule speaks: at most one static_assert fires (a full compile's output).
string(REGEX MATCHALL "static assertion failed" asserts "${out}")
list(LENGTH asserts n_asserts)
if(n_asserts GREATER 1)
  message(FATAL_ERROR "${n_asserts} static_asserts fired; only the first broken rule may speak")
endif()
