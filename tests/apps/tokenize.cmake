# `hybridrl tokenize` (run by ctest with -P). Variables: EXE (the hybridrl program), FIXTURES
# (tests/fixtures), WORK (a scratch directory). The Qwen2-style fixture tokenizer encodes
# cli_input.jsonl to exactly cli_ids.jsonl and decodes that to exactly cli_texts.jsonl — files
# written by Hugging Face tokenizers (make_tokenizer_fixtures.py), compared byte for byte. Bad
# input is refused with exit 1 and a message naming the file and line.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(tok ${FIXTURES}/tokenizers/qwen2)

function(tokenize rc_var err_var)
  execute_process(COMMAND ${EXE} tokenize ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(${rc_var} ${rc} PARENT_SCOPE)
  set(${err_var} "${out}${err}" PARENT_SCOPE)
endfunction()

tokenize(rc err --model ${tok} --input ${tok}/cli_input.jsonl --output ${WORK}/ids.jsonl)
if(NOT rc EQUAL 0 OR NOT err MATCHES "100 lines")
  message(FATAL_ERROR "hybridrl tokenize failed (${rc}): ${err}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${WORK}/ids.jsonl ${tok}/cli_ids.jsonl RESULT_VARIABLE diff)
if(NOT diff EQUAL 0)
  message(FATAL_ERROR "the ids differ from Hugging Face tokenizers' (${WORK}/ids.jsonl vs ${tok}/cli_ids.jsonl)")
endif()
tokenize(rc err --model ${tok} --input ${WORK}/ids.jsonl --output ${WORK}/texts.jsonl --decode)
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${WORK}/texts.jsonl ${tok}/cli_texts.jsonl RESULT_VARIABLE diff)
if(NOT rc EQUAL 0 OR NOT diff EQUAL 0)
  message(FATAL_ERROR "--decode (${rc}) differs from Hugging Face tokenizers' (${WORK}/texts.jsonl): ${err}")
endif()

# bad input: a line without text, an id outside the vocabulary, a directory without a tokenizer
file(WRITE ${WORK}/bad.jsonl "{\"text\": \"fine\"}\n{\"prompt\": \"no text\"}\n")
tokenize(rc err --model ${tok} --input ${WORK}/bad.jsonl --output ${WORK}/bad_out.jsonl)
if(NOT rc EQUAL 1 OR NOT err MATCHES "bad.jsonl line 2: no \"text\" string" OR EXISTS ${WORK}/bad_out.jsonl)
  message(FATAL_ERROR "a line without text: expected exit 1 naming line 2 and no output, got ${rc}: ${err}")
endif()
file(WRITE ${WORK}/bad_ids.jsonl "{\"ids\": [1, 99999]}\n")
tokenize(rc err --model ${tok} --input ${WORK}/bad_ids.jsonl --output ${WORK}/bad_out.jsonl --decode)
if(NOT rc EQUAL 1 OR NOT err MATCHES "line 1: id 99999 is outside the vocabulary")
  message(FATAL_ERROR "an id outside the vocabulary: expected exit 1, got ${rc}: ${err}")
endif()
tokenize(rc err --model ${FIXTURES}/models/llama --input ${tok}/cli_input.jsonl --output ${WORK}/x.jsonl)
if(NOT rc EQUAL 1 OR NOT err MATCHES "has neither tokenizer.json nor tokenizer.model")
  message(FATAL_ERROR "a checkpoint without a tokenizer: expected exit 1, got ${rc}: ${err}")
endif()
