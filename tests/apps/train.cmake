# End-to-end checks of `hybridrl train` (run by ctest with -P). Variables:
#   EXE  the hybridrl program   FIXTURES  tests/fixtures   WORK  a scratch directory   MODE  below
# grpo: GRPO on the built-in reverse task with model.init=tiny through Rollout<Paged>: exit 0, a
#   progress line, one metrics.jsonl line per step with the issue's keys, a checkpoint, the final
#   Hugging Face model; run again with more steps it resumes from the checkpoint (trainer.resume=auto).
# ppo: PPO (critic from the policy's trunk) on the reverse task through Rollout<Naive>: the critic's
#   metrics in metrics.jsonl, the critic written next to the model; `--help` with algorithm.name=ppo
#   lists the critic's keys.
# reward_model: GRPO on the fixture prompts scored by the fixture reward model (reward.name=model;
#   the policy samples ids the byte tokenizer cannot decode: they are left out of the text);
#   a missing path and a policy checkpoint as the reward model are refused.
# example: an example's config.yaml (CONFIG) through `hybridrl train --config` (or an example
#   program: EXE with SUBCOMMAND empty), STEPS steps (default 2); with RISE the mean reward of
#   the last step must exceed the first's.
# demo: scripts/demo.sh end to end (label slow); GRPO's last mean reward must be >= 0.9.
# cuda: GRPO and PPO with model.device=cuda (registered on CUDA builds; skipped without a device).
# dpo_yaml: DPO on the fixture pairs from a YAML file whose total_steps the command line overrides;
#   the first step's loss is ln 2 (policy = reference); data.train_files as a bare list on the
#   command line.
# errors: a mistyped key names the nearest one; an unknown algorithm and a run without data are
#   refused with exit 1 before any model is loaded; the configuration mistakes of docs/reliability.md
#   ("Bad configuration") that `hybridrl train` itself checks are refused with exit 1 and their message.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
if(NOT DEFINED SUBCOMMAND)
  set(SUBCOMMAND train)
endif()

function(run_train rc_var err_var)
  execute_process(COMMAND ${EXE} ${SUBCOMMAND} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(${rc_var} ${rc} PARENT_SCOPE)
  set(${err_var} "${out}${err}" PARENT_SCOPE)
endfunction()

function(line_count path out_var)
  file(STRINGS ${path} lines)
  list(LENGTH lines n)
  set(${out_var} ${n} PARENT_SCOPE)
endfunction()

if(MODE STREQUAL "grpo")
  set(args task.name=reverse model.init=tiny trainer.output_dir=${WORK}/run trainer.save_every=2
    data.train_batch_size=4 rollout.n=4 rollout.max_new_tokens=4 rollout.kv_cache_tokens=2048
    geometry.ppo_mini_batch_size=4 geometry.micro_batch_size_per_gpu=16 optim.lr=1e-3)
  run_train(rc err ${args} trainer.total_steps=4)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "hybridrl train failed (${rc}): ${err}")
  endif()
  if(NOT err MATCHES "step 4/4 \\(100%\\) \\| [0-9.]+ s/step \\| ETA [0-9]+s \\| reward_mean")
    message(FATAL_ERROR "no progress line: ${err}")
  endif()
  line_count(${WORK}/run/metrics.jsonl n)
  if(NOT n EQUAL 4)
    message(FATAL_ERROR "${n} metrics lines, expected 4")
  endif()
  file(STRINGS ${WORK}/run/metrics.jsonl lines)
  list(GET lines 3 last)
  foreach(key step reward_mean reward_std kl entropy clip_frac grad_norm lr response_length_mean tokens_per_s
      time/generate time/ref time/old_log_prob time/advantage time/update time/weight_sync
      memory/allocated_gb memory/reserved_gb memory/peak_gb)
    string(JSON v ERROR_VARIABLE e GET "${last}" ${key})
    if(e)
      message(FATAL_ERROR "metrics.jsonl has no ${key}: ${last}")
    endif()
  endforeach()
  foreach(f checkpoints/step_00000004/model.safetensors checkpoints/step_00000004/trainer_state.json
      model/config.json model/model.safetensors metrics.svg run_config.json)
    if(NOT EXISTS ${WORK}/run/${f})
      message(FATAL_ERROR "the run wrote no ${f}")
    endif()
  endforeach()
  file(READ ${WORK}/run/run_config.json cfg)
  string(JSON task GET "${cfg}" task name)
  if(NOT task STREQUAL "reverse")
    message(FATAL_ERROR "run_config.json lacks the program's keys: ${cfg}")
  endif()
  # more steps on the same output directory: resumed from step 4
  run_train(rc err ${args} trainer.total_steps=6)
  if(NOT rc EQUAL 0 OR NOT err MATCHES "done, 6 steps \\(resumed from step 4\\)")
    message(FATAL_ERROR "the second run did not resume (${rc}): ${err}")
  endif()
  line_count(${WORK}/run/metrics.jsonl n)
  if(NOT n EQUAL 6)
    message(FATAL_ERROR "${n} metrics lines after the resume, expected 6")
  endif()
elseif(MODE STREQUAL "ppo")
  run_train(rc err algorithm.name=ppo rollout.name=naive task.name=reverse model.init=tiny trainer.output_dir=${WORK}/run
    trainer.total_steps=3 data.train_batch_size=4 rollout.n=2 rollout.max_new_tokens=4 geometry.ppo_mini_batch_size=4
    geometry.micro_batch_size_per_gpu=8 optim.lr=1e-3 critic.optim.lr=1e-3 critic.warmup_steps=1)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "hybridrl train (PPO) failed (${rc}): ${err}")
  endif()
  file(STRINGS ${WORK}/run/metrics.jsonl lines)
  list(LENGTH lines n)
  if(NOT n EQUAL 3)
    message(FATAL_ERROR "${n} metrics lines, expected 3")
  endif()
  list(GET lines 0 first)
  list(GET lines 2 last)
  foreach(key critic/vf_loss critic/grad_norm critic/vf_explained_var time/values grad_norm)
    string(JSON v ERROR_VARIABLE e GET "${last}" ${key})
    if(e)
      message(FATAL_ERROR "metrics.jsonl has no ${key}: ${last}")
    endif()
  endforeach()
  string(JSON v ERROR_VARIABLE e GET "${first}" grad_norm)
  if(NOT e)
    message(FATAL_ERROR "critic.warmup_steps=1 updated the policy at step 1: ${first}")
  endif()
  foreach(f critic/config.json critic/model.safetensors model/config.json)
    if(NOT EXISTS ${WORK}/run/${f})
      message(FATAL_ERROR "the PPO run wrote no ${f}")
    endif()
  endforeach()
  file(READ ${WORK}/run/critic/config.json critic_cfg)
  if(NOT critic_cfg MATCHES "ForTokenClassification")
    message(FATAL_ERROR "the critic is not saved as a ForTokenClassification model: ${critic_cfg}")
  endif()
  execute_process(COMMAND ${EXE} train algorithm.name=ppo --help RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE herr)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "critic.optim.lr" OR NOT out MATCHES "critic.warmup_steps" OR NOT out MATCHES "model.critic_path")
    message(FATAL_ERROR "train algorithm.name=ppo --help lists no critic keys (${rc}): ${out}${herr}")
  endif()
elseif(MODE STREQUAL "reward_model")
  # the fixture policy's vocabulary (320) is wider than the byte tokenizer's (259): a sampled id
  # past it has no text, and the reward model scores the ids as drawn
  run_train(rc err algorithm.name=grpo rollout.name=naive model.path=${FIXTURES}/models/llama
    data.train_files=[${FIXTURES}/data/prompts.jsonl] reward.name=model reward.model_path=${FIXTURES}/models/llama_rm
    reward.micro_batch_size=3 trainer.total_steps=2 trainer.output_dir=${WORK}/run trainer.save_model=false
    data.train_batch_size=2 rollout.n=4 rollout.max_new_tokens=6 geometry.ppo_mini_batch_size=2
    geometry.micro_batch_size_per_gpu=8 optim.lr=1e-3 loader.epochs=0)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "GRPO with a reward model failed (${rc}): ${err}")
  endif()
  file(STRINGS ${WORK}/run/metrics.jsonl lines)
  list(GET lines 0 first)
  string(JSON std GET "${first}" reward_std)
  if(NOT std GREATER 0)
    message(FATAL_ERROR "the reward model gave every response the same score: ${first}")
  endif()
  run_train(rc err algorithm.name=grpo model.path=${FIXTURES}/models/llama data.train_files=[${FIXTURES}/data/prompts.jsonl]
    reward.name=model trainer.total_steps=1)
  if(NOT rc EQUAL 1 OR NOT err MATCHES "name = model but model_path is empty")
    message(FATAL_ERROR "reward.name=model without a path: exit ${rc}, ${err}")
  endif()
  run_train(rc err algorithm.name=grpo model.path=${FIXTURES}/models/llama data.train_files=[${FIXTURES}/data/prompts.jsonl]
    reward.name=model reward.model_path=${FIXTURES}/models/llama trainer.total_steps=1)
  if(NOT rc EQUAL 1 OR NOT err MATCHES "not a reward model")
    message(FATAL_ERROR "a policy checkpoint as the reward model: exit ${rc}, ${err}")
  endif()
elseif(MODE STREQUAL "example")
  if(NOT DEFINED STEPS)
    set(STEPS 2)
  endif()
  run_train(rc err --config ${CONFIG} trainer.total_steps=${STEPS} trainer.output_dir=${WORK}/run)
  if(NOT rc EQUAL 0 OR NOT err MATCHES "done, ${STEPS} steps")
    message(FATAL_ERROR "${EXE} ${SUBCOMMAND} --config ${CONFIG} failed (${rc}): ${err}")
  endif()
  foreach(f metrics.jsonl metrics.svg model/config.json run_config.json)
    if(NOT EXISTS ${WORK}/run/${f})
      message(FATAL_ERROR "${CONFIG}: the run wrote no ${f}")
    endif()
  endforeach()
  line_count(${WORK}/run/metrics.jsonl n)
  if(NOT n EQUAL STEPS)
    message(FATAL_ERROR "${CONFIG}: ${n} lines in metrics.jsonl for ${STEPS} steps")
  endif()
  if(RISE)
    file(STRINGS ${WORK}/run/metrics.jsonl lines)
    list(GET lines 0 first)
    list(GET lines -1 last)
    string(JSON r0 GET "${first}" reward_mean)
    string(JSON r1 GET "${last}" reward_mean)
    message(STATUS "${CONFIG}: reward_mean ${r0} at step 1 -> ${r1} at step ${STEPS}")
    if(NOT r1 GREATER r0)
      message(FATAL_ERROR "${CONFIG}: the mean reward did not rise (${r0} -> ${r1}): ${err}")
    endif()
  endif()
elseif(MODE STREQUAL "demo")
  # FIXTURES is the source root here
  execute_process(COMMAND env OUT=${WORK} BUILD_DIR=${BUILD_ROOT} bash ${FIXTURES}/scripts/demo.sh
    WORKING_DIRECTORY ${FIXTURES} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "-> last [0-9]+ steps ([0-9.]+)")
    message(FATAL_ERROR "scripts/demo.sh failed (${rc}): ${out}${err}")
  endif()
  set(last ${CMAKE_MATCH_1})
  if(last LESS 0.9)
    message(FATAL_ERROR "the demo's GRPO ended at a mean reward of ${last}, below 0.9: ${out}")
  endif()
  message(STATUS "demo: GRPO's last mean reward ${last}")
elseif(MODE STREQUAL "cuda")
  execute_process(COMMAND ${EXE} info --json OUTPUT_VARIABLE info)
  string(JSON devices GET "${info}" cuda_device_count)
  if(devices EQUAL 0)
    message(STATUS "no CUDA device: skipped")
    return()
  endif()
  foreach(algo grpo ppo)
    run_train(rc err algorithm.name=${algo} task.name=reverse model.init=tiny model.device=cuda trainer.total_steps=3
      trainer.output_dir=${WORK}/${algo} data.train_batch_size=16 rollout.n=8 rollout.max_new_tokens=5
      geometry.ppo_mini_batch_size=4 geometry.micro_batch_size_per_gpu=32 optim.lr=5e-4)
    if(NOT rc EQUAL 0 OR NOT err MATCHES "step 3/3")
      message(FATAL_ERROR "hybridrl train ${algo} on CUDA failed (${rc}): ${err}")
    endif()
    file(STRINGS ${WORK}/${algo}/metrics.jsonl lines)
    list(GET lines 2 last)
    string(JSON peak GET "${last}" memory/peak_gb)
    if(NOT peak GREATER 0)
      message(FATAL_ERROR "no CUDA memory reported: ${last}")
    endif()
  endforeach()
elseif(MODE STREQUAL "dpo_yaml")
  file(WRITE ${WORK}/run.yaml "algorithm: {name: dpo, beta: 0.1}\nmodel: {path: ${FIXTURES}/models/llama}\n"
    "data: {train_files: [${FIXTURES}/data/pairs.jsonl], train_batch_size: 2}\n"
    "geometry: {ppo_mini_batch_size: 2, micro_batch_size_per_gpu: 1}\n"
    "trainer: {total_steps: 5, output_dir: ${WORK}/run, save_model: false}\n"
    "loader: {epochs: 0}\n")
  run_train(rc err --config ${WORK}/run.yaml trainer.total_steps=2)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "hybridrl train (DPO) failed (${rc}): ${err}")
  endif()
  line_count(${WORK}/run/metrics.jsonl n)
  if(NOT n EQUAL 2)
    message(FATAL_ERROR "${n} metrics lines, expected 2 (the command line overrides the file's total_steps)")
  endif()
  file(STRINGS ${WORK}/run/metrics.jsonl lines)
  list(GET lines 0 first)
  string(JSON loss GET "${first}" dpo/loss)
  if(loss LESS 0.69314 OR loss GREATER 0.69315)
    message(FATAL_ERROR "the first DPO step's loss is ${loss}, expected ln 2 = 0.693147")
  endif()
  if(EXISTS ${WORK}/run/model)
    message(FATAL_ERROR "trainer.save_model=false wrote the model")
  endif()
  # the same data given on the command line as a bare list (README's spelling)
  run_train(rc err algorithm.name=dpo model.path=${FIXTURES}/models/llama data.train_files=[${FIXTURES}/data/pairs.jsonl]
    data.train_batch_size=2 geometry.ppo_mini_batch_size=2 trainer.total_steps=1 trainer.output_dir=${WORK}/cli
    trainer.save_model=false loader.epochs=0)
  if(NOT rc EQUAL 0 OR NOT EXISTS ${WORK}/cli/metrics.jsonl)
    message(FATAL_ERROR "data.train_files as a bare list (${rc}): ${err}")
  endif()
elseif(MODE STREQUAL "errors")
  run_train(rc err task.name=reverse model.init=tiny trainer.totl_steps=3)
  if(NOT rc EQUAL 1 OR NOT err MATCHES "did you mean trainer.total_steps")
    message(FATAL_ERROR "a mistyped key: exit ${rc}, ${err}")
  endif()
  run_train(rc err algorithm.name=rloo task.name=reverse model.init=tiny)
  if(NOT rc EQUAL 1 OR NOT err MATCHES "algorithm.name = \"rloo\" is not one of grpo, ppo, dpo, kto, sft")
    message(FATAL_ERROR "an unknown algorithm: exit ${rc}, ${err}")
  endif()
  run_train(rc err algorithm.name=dpo sharding.name=tp3d model.path=${FIXTURES}/models/llama
    data.train_files=[${FIXTURES}/data/pairs.jsonl])
  if(NOT rc EQUAL 1 OR NOT err MATCHES "sharding.name = \"tp3d\" is not one of fsdp \\(with algorithm.name = dpo\\)")
    message(FATAL_ERROR "sharding.name=tp3d with dpo: exit ${rc}, ${err}")
  endif()
  run_train(rc err model.init=tiny)
  if(NOT rc EQUAL 1 OR NOT err MATCHES "neither task.name nor data.train_files is set")
    message(FATAL_ERROR "a run without data: exit ${rc}, ${err}")
  endif()
  run_train(rc err task.name=reverse model.path=${WORK}/nowhere)
  if(NOT rc EQUAL 1)
    message(FATAL_ERROR "a missing checkpoint: exit ${rc}, ${err}")
  endif()
  # configuration mistakes (docs/reliability.md, "Bad configuration"): exit 1 with the message
  set(tiny task.name=reverse model.init=tiny trainer.save_model=false data.train_batch_size=2 rollout.n=2
    rollout.max_new_tokens=4 geometry.ppo_mini_batch_size=2 geometry.micro_batch_size_per_gpu=4 trainer.total_steps=1)
  function(refused what pattern)
    run_train(rc err ${ARGN})
    if(NOT rc EQUAL 1 OR NOT err MATCHES "${pattern}")
      message(FATAL_ERROR "${what}: exit ${rc}, ${err}")
    endif()
  endfunction()
  refused("verl's global micro-batch key" "did you mean geometry.micro_batch_size_per_gpu\\? \\(verl's actor_rollout_ref.actor.ppo_micro_batch_size: it counts sequences over all GPUs"
    ${tiny} actor_rollout_ref.actor.ppo_micro_batch_size=64)
  refused("a micro-batch larger than the mini-batch" "geometry.micro_batch_size_per_gpu 8 is larger than a rank's mini-batch"
    ${tiny} geometry.micro_batch_size_per_gpu=8)
  refused("an integer dtype" "model.dtype = int64 is not a floating-point type" ${tiny} model.dtype=int64)
  refused("a device this process does not see" "model.device = cuda:99 but this process sees" ${tiny} model.device=cuda:99)
  refused("nccl on the CPU" "distributed.backend = nccl but model.device = cpu" ${tiny} distributed.backend=nccl)
  # refused before the checkpoint is opened: it does not exist
  refused("an unknown reward" "reward \"nonsense\" is not a built-in reward" ${tiny} model.init= model.path=${WORK}/nowhere reward.name=nonsense)
  refused("prompt + response past the context" "data.max_prompt_length \\+ rollout.max_new_tokens = 200 \\+ 100 = 300 exceeds the model's max_position_embeddings = 256"
    ${tiny} data.max_prompt_length=200 rollout.max_new_tokens=100)
  refused("a KV pool too small for one sequence" "rollout.kv_cache_tokens = 8 holds 1 KV block\\(s\\) of 16 tokens"
    ${tiny} rollout.kv_cache_tokens=8)
  refused("an endless online run" "trainer.total_steps = 0 with loader.epochs = 0 \\(endless\\) gives no end"
    ${tiny} trainer.total_steps=0 loader.epochs=0)
  refused("more steps than the epochs hold" "trainer.total_steps = 1000 but loader.epochs = 1 hold 256 batches"
    ${tiny} trainer.total_steps=1000)
  refused("a missing data file" "cannot open data.train_files entry '${WORK}/missing.jsonl'"
    ${tiny} task.name= data.train_files=[${WORK}/missing.jsonl])
  run_train(rc err ${tiny} trainer.output_dir=${WORK}/earlier)  # a run whose checkpoint is there
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the tiny run failed (${rc}): ${err}")
  endif()
  refused("trainer.resume=never over an earlier run" "trainer.resume = never but '${WORK}/earlier/checkpoints' holds checkpoints of an earlier run"
    ${tiny} trainer.output_dir=${WORK}/earlier trainer.resume=never)
else()
  message(FATAL_ERROR "unknown MODE ${MODE}")
endif()
