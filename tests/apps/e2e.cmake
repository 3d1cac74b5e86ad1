# A real-checkpoint run end to end (run by ctest with -P; needs tokenizer.json: PCRE2 + ICU).
#   EXE  the hybridrl program   FIXTURES  tests/fixtures   WORK  a scratch directory
#   PYTHON (optional) a Python with torch + transformers: then transformers must load the trained
#          model and its greedy generate() must equal `hybridrl generate` on it
#          (tests/fixtures/make_model_fixtures.py --check-generate)
# The fixture models/qwen2_chat is Qwen2.5-shaped (random weights made by transformers, the qwen2
# fixture tokenizer.json with its ChatML template, a vocabulary padded past the tokenizer's,
# generation_config.json stopping at <|im_end|> and <|endoftext|>):
# 1. `hybridrl generate` of the GSM8K questions as `messages` (greedy): the prompt ids equal
#    transformers' apply_chat_template, the responses and finish reasons its generate()
#    (models/qwen2_chat/hf_greedy.json; one of them ends at a generation_config.json stop id).
# 2. `hybridrl train` GRPO on data/gsm8k.jsonl as written (question, answer with "#### n"):
#    data.prompt_key=question, data.as_chat=true, reward.name=gsm8k, 3 steps, a checkpoint, the
#    final model with the tokenizer and generation config next to it.
#    The run names its tokenizer and chat format; a bad data line is reported before the weights
#    load (they are unreadable in that case).
# 3. `hybridrl generate` on the trained model; with PYTHON, transformers' check of it.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(model ${FIXTURES}/models/qwen2_chat)
file(READ ${model}/hf_greedy.json ref)
string(JSON n_q LENGTH "${ref}" questions)
string(JSON max_new GET "${ref}" max_new_tokens)
math(EXPR last "${n_q} - 1")
set(lines "")
foreach(i RANGE ${last})
  string(JSON q GET "${ref}" questions ${i})
  if(q MATCHES "[\"\\]")
    message(FATAL_ERROR "question ${i} needs JSON escaping, which this script does not do: ${q}")
  endif()
  string(APPEND lines "{\"messages\": [{\"role\": \"user\", \"content\": \"${q}\"}]}\n")
endforeach()
file(WRITE ${WORK}/questions.jsonl "${lines}")

# The lines of a JSONL file as variables <prefix>_0, <prefix>_1, ... and their count (file(STRINGS)
# would split a response text at its semicolons).
function(read_lines path prefix count_var)
  file(READ ${path} content)
  set(i 0)
  while(NOT content STREQUAL "")
    string(FIND "${content}" "\n" at)
    if(at EQUAL -1)
      set(line "${content}")
      set(content "")
    else()
      string(SUBSTRING "${content}" 0 ${at} line)
      math(EXPR next "${at} + 1")
      string(SUBSTRING "${content}" ${next} -1 content)
    endif()
    if(NOT line STREQUAL "")
      set(${prefix}_${i} "${line}" PARENT_SCOPE)
      math(EXPR i "${i} + 1")
    endif()
  endwhile()
  set(${count_var} ${i} PARENT_SCOPE)
endfunction()

function(run_cli rc_var err_var)
  execute_process(COMMAND ${EXE} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(${rc_var} ${rc} PARENT_SCOPE)
  set(${err_var} "${out}${err}" PARENT_SCOPE)
endfunction()

# 1. generate on the fixture = transformers
run_cli(rc err generate --input ${WORK}/questions.jsonl --output ${WORK}/fixture_out.jsonl model.path=${model}
  rollout.temperature=0 rollout.max_new_tokens=${max_new})
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "hybridrl generate on qwen2_chat failed (${rc}): ${err}")
endif()
read_lines(${WORK}/fixture_out.jsonl out n_out)
if(NOT n_out EQUAL n_q)
  message(FATAL_ERROR "${n_out} output lines, expected ${n_q}")
endif()
set(stops 0)
foreach(k RANGE ${last})
  set(line "${out_${k}}")
  foreach(field prompt_ids response_ids finish_reason)
    string(JSON got_${field} GET "${line}" ${field})
    string(JSON want_${field} GET "${ref}" greedy ${k} ${field})
    string(REGEX REPLACE "[ \n]" "" got_${field} "${got_${field}}")
    string(REGEX REPLACE "[ \n]" "" want_${field} "${want_${field}}")
    if(NOT got_${field} STREQUAL want_${field})
      message(FATAL_ERROR "question ${k}: ${field} ${got_${field}}, transformers ${want_${field}}")
    endif()
  endforeach()
  if(got_finish_reason STREQUAL "stop")
    math(EXPR stops "${stops} + 1")
  endif()
endforeach()
if(stops EQUAL 0)
  message(FATAL_ERROR "no response ended at a stop id: the fixture no longer tests generation_config.json")
endif()

# 2. GRPO on GSM8K's JSONL as written
set(args algorithm.name=grpo model.path=${model} data.train_files=[${FIXTURES}/data/gsm8k.jsonl]
  data.prompt_key=question data.as_chat=true "data.prompt_template={prompt} Give the answer after ####."
  reward.name=gsm8k trainer.output_dir=${WORK}/run trainer.total_steps=3 trainer.save_every=3
  data.train_batch_size=2 rollout.n=4 rollout.max_new_tokens=12 rollout.kv_cache_tokens=4096
  geometry.ppo_mini_batch_size=2 geometry.micro_batch_size_per_gpu=8 optim.lr=1e-3)
run_cli(rc err train ${args})
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "hybridrl train on GSM8K failed (${rc}): ${err}")
endif()
if(NOT err MATCHES "tokenizer [^\n]*tokenizer.json \\(2709 ids\\), chat format chatml")
  message(FATAL_ERROR "the run does not say which tokenizer and chat format it uses: ${err}")
endif()
read_lines(${WORK}/run/metrics.jsonl metric n)
if(NOT n EQUAL 3)
  message(FATAL_ERROR "${n} metrics lines, expected 3")
endif()
foreach(f checkpoints/step_00000003/model.safetensors checkpoints/step_00000003/trainer_state.json
    model/config.json model/model.safetensors model/tokenizer.json model/tokenizer_config.json
    model/generation_config.json)
  if(NOT EXISTS ${WORK}/run/${f})
    message(FATAL_ERROR "the run wrote no ${f}")
  endif()
endforeach()
file(READ ${WORK}/run/run_config.json cfg)
string(JSON key GET "${cfg}" data prompt_key)
if(NOT key STREQUAL "question")
  message(FATAL_ERROR "run_config.json lacks data.prompt_key: ${cfg}")
endif()

# 2b. the data is read before the weights: a bad line is reported even when the weights are
#     unreadable (a multi-gigabyte load is not wasted on a typo in the data)
file(MAKE_DIRECTORY ${WORK}/broken)
foreach(f config.json generation_config.json tokenizer.json tokenizer_config.json)
  file(COPY ${model}/${f} DESTINATION ${WORK}/broken)
endforeach()
file(WRITE ${WORK}/broken/model.safetensors "not safetensors")
file(WRITE ${WORK}/bad.jsonl "{\"question\": \"What is 2 + 2?\", \"answer\": \"#### 4\"}\n{\"question\": 7}\n")
set(bad_args ${args})
list(TRANSFORM bad_args REPLACE "^model.path=.*" "model.path=${WORK}/broken")
list(TRANSFORM bad_args REPLACE "^data.train_files=.*" "data.train_files=[${WORK}/bad.jsonl]")
list(TRANSFORM bad_args REPLACE "^trainer.output_dir=.*" "trainer.output_dir=${WORK}/bad_run")
run_cli(rc err train ${bad_args})
if(NOT rc EQUAL 1 OR NOT err MATCHES "bad.jsonl:2:" OR err MATCHES "safetensors")
  message(FATAL_ERROR "a bad data line with unreadable weights: expected the line's error first (${rc}): ${err}")
endif()

# 3. the trained model: generate, and (with PYTHON) transformers' greedy on it
run_cli(rc err generate --input ${WORK}/questions.jsonl --output ${WORK}/trained_out.jsonl model.path=${WORK}/run/model
  rollout.temperature=0 rollout.max_new_tokens=${max_new})
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "hybridrl generate on the trained model failed (${rc}): ${err}")
endif()
read_lines(${WORK}/trained_out.jsonl trained n_trained)
if(NOT n_trained EQUAL n_q)
  message(FATAL_ERROR "${n_trained} lines from the trained model, expected ${n_q}")
endif()
set(changed 0)  # the export is the trained model, not a copy of the fixture
foreach(k RANGE ${last})
  string(JSON a GET "${trained_${k}}" log_probs)
  string(JSON b GET "${out_${k}}" log_probs)
  if(NOT a STREQUAL b)
    math(EXPR changed "${changed} + 1")
  endif()
endforeach()
if(changed EQUAL 0)
  message(FATAL_ERROR "the trained model generates exactly as the fixture: did training change the weights?")
endif()
set(first "${trained_0}")
string(JSON text ERROR_VARIABLE e GET "${first}" response)
if(e)
  message(FATAL_ERROR "the trained model's output has no response text: ${first}")
endif()
if(PYTHON)
  execute_process(COMMAND ${PYTHON} ${FIXTURES}/make_model_fixtures.py --check-generate ${WORK}/run/model
    ${WORK}/trained_out.jsonl RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE perr)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "transformers disagrees with hybridrl generate on the trained model (${rc}): ${out}${perr}")
  endif()
  message(STATUS "${out}")
endif()
