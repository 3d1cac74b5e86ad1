# `hybridrl train` on several processes (run by ctest with -P), launched the way torchrun does it:
# `hybridrl launch --nproc-per-node 2 -- train ...` sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR
# (127.0.0.1) and MASTER_PORT; the ranks meet at rank 0's TCPStore and train over Gloo.
#   EXE  the hybridrl program   WORK  a scratch directory   FIXTURES  tests/fixtures
# 1. GRPO on the reverse task (model.init=tiny, Sharding<FSDP> over 2 ranks): exit 0, the layout
#    line, rank 0 alone writes metrics.jsonl (one line per step), the checkpoint and the model.
# 2. The 2-rank checkpoint resumes on one process.
# 3. A rank whose peer never starts stops within distributed.store_timeout_s with the error that
#    names the address; a geometry the ranks cannot split is refused before any model loads.
# 4. A peer killed mid-run (SIGKILL after 15 s of a long run): the other rank stops with an Error
#    naming the collective, well within distributed.timeout_s, not a hang.
# 5. GRPO scored by the fixture reward model (reward.name=model) on 2 ranks: the reward model is
#    sharded over them (the layout says so) and the run trains its 2 steps.
# 6. placement.actor=0-1, reference=2, reward=1-2 on 3 ranks trains its 2 steps; placement.reference=5
#    on 2 ranks is refused before the tokenizer loads; a placed run's checkpoint resumes, its step 3 the
#    uninterrupted run's; DPO with placement.reference=2 beside a 2-rank actor trains its 2 steps.
# 7. trainer.checkpoint_format=sharded on 2 ranks: a shard file per rank (and the HF weights on
#    request); one process resumes it.
# 8. sharding.name=tp3d: PPO on 2 ranks, tensor parallel 2; one process resumes its checkpoint.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
function(run_cli rc_var err_var)
  execute_process(COMMAND ${EXE} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(${rc_var} ${rc} PARENT_SCOPE)
  set(${err_var} "${out}${err}" PARENT_SCOPE)
endfunction()
function(expect_metrics_lines n why)
  file(STRINGS ${WORK}/run/metrics.jsonl lines)
  list(LENGTH lines got)
  if(NOT got EQUAL n)
    message(FATAL_ERROR "metrics.jsonl has ${got} lines, expected ${n} (${why})")
  endif()
endfunction()
# `dir`/metrics.jsonl has `n` lines and the last matches every regex after `why`.
function(expect_last_metrics dir n why)
  file(STRINGS ${dir}/metrics.jsonl lines)
  list(LENGTH lines got)
  if(NOT got EQUAL n)
    message(FATAL_ERROR "${why}: metrics.jsonl has ${got} lines, expected ${n}")
  endif()
  math(EXPR last "${n} - 1")
  list(GET lines ${last} line)
  foreach(want ${ARGN})
    if(NOT line MATCHES "${want}")
      message(FATAL_ERROR "${why}: the last metrics line has no ${want}: ${line}")
    endif()
  endforeach()
endfunction()
set(args algorithm.name=grpo rollout.name=naive task.name=reverse model.init=tiny trainer.output_dir=${WORK}/run
  trainer.save_every=2 data.train_batch_size=4 rollout.n=4 rollout.max_new_tokens=4
  geometry.ppo_mini_batch_size=4 geometry.micro_batch_size_per_gpu=8 optim.lr=1e-3 distributed.timeout_s=120)

# 1. two ranks
run_cli(rc err launch --nproc-per-node 2 -- train ${args} trainer.total_steps=2)
if(NOT rc EQUAL 0 AND err MATCHES "ships no gloo headers")  # the pip wheels' LibTorch: CPU ranks need Gloo
  message(STATUS "no Gloo in this LibTorch: skipped")
  return()
endif()
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "hybridrl launch --nproc-per-node 2 -- train failed (${rc}): ${err}")
endif()
if(NOT err MATCHES "2 ranks \\(torchrun, gloo backend\\): data parallel 2, Sharding<FSDP> over 2 rank")
  message(FATAL_ERROR "no layout line: ${err}")
endif()
string(REGEX MATCHALL "hybridrl train: done" done "${err}")
list(LENGTH done n_done)
if(NOT n_done EQUAL 1)
  message(FATAL_ERROR "${n_done} ranks printed the summary, expected rank 0 alone: ${err}")
endif()
expect_metrics_lines(2 "one writer")
foreach(f checkpoints/step_00000002/model.safetensors checkpoints/step_00000002/trainer_state.json
    model/config.json model/model.safetensors run_config.json)
  if(NOT EXISTS ${WORK}/run/${f})
    message(FATAL_ERROR "the 2-rank run wrote no ${f}")
  endif()
endforeach()

# 2. resumed on one process
run_cli(rc err train ${args} trainer.total_steps=3)
if(NOT rc EQUAL 0 OR NOT err MATCHES "resumed from step 2")
  message(FATAL_ERROR "one process did not resume the 2-rank checkpoint (${rc}): ${err}")
endif()
expect_metrics_lines(3 "after the resume")

# 3. a peer that never starts: rank 0 of 2 alone, within the store timeout
string(RANDOM LENGTH 4 ALPHABET 123456789 r)
math(EXPR port "20000 + ${r} % 20000")
execute_process(COMMAND ${CMAKE_COMMAND} -E env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=${port}
    ${EXE} train ${args} trainer.output_dir=${WORK}/alone distributed.store_timeout_s=2
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
if(NOT rc EQUAL 1 OR NOT err MATCHES "rank 0 of 2 \\(torchrun\\) could not meet the others")
  message(FATAL_ERROR "a missing peer: expected exit 1 naming the rendezvous (${rc}): ${out}${err}")
endif()
# 3b. 4 prompts do not split over 3 ranks: refused on every rank before a model loads
run_cli(rc err launch --nproc-per-node 3 -- train ${args} data.train_batch_size=4 trainer.output_dir=${WORK}/three)
if(rc EQUAL 0 OR NOT err MATCHES "world_size 3")
  message(FATAL_ERROR "a batch that does not split over 3 ranks was not refused (${rc}): ${err}")
endif()

# 4. a peer that dies mid-run: rank 1 is killed after 15 s; rank 0 must end with the Error quickly.
# Both run at once (execute_process runs its COMMANDs concurrently; coreutils env execs, so the
# kill reaches hybridrl itself); rank 1 first, so rank 0's
# output is not a pipe into a dead process.
string(RANDOM LENGTH 4 ALPHABET 123456789 r)
math(EXPR port "20000 + ${r} % 20000")
set(env_common WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=${port})
string(TIMESTAMP t0 "%s")
execute_process(
  COMMAND timeout -s KILL 15 env RANK=1 LOCAL_RANK=1 ${env_common}
    ${EXE} train ${args} trainer.output_dir=${WORK}/dead trainer.total_steps=100000 loader.epochs=0 trainer.save_every=0
    distributed.timeout_s=100 distributed.store_timeout_s=60
  COMMAND ${CMAKE_COMMAND} -E env RANK=0 LOCAL_RANK=0 ${env_common}
    ${EXE} train ${args} trainer.output_dir=${WORK}/dead trainer.total_steps=100000 loader.epochs=0 trainer.save_every=0
    distributed.timeout_s=100 distributed.store_timeout_s=60
  RESULTS_VARIABLE rcs OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 200)
string(TIMESTAMP t1 "%s")
math(EXPR took "${t1} - ${t0}")
list(GET rcs 1 rc0)
if(NOT rc0 EQUAL 1 OR NOT err MATCHES "over gloo failed" OR NOT err MATCHES "step [0-9]+/100000"
   OR NOT err MATCHES "rank 1 sent no report within [0-9.]+ s of this failure: stalled or died")
  message(FATAL_ERROR "a peer killed mid-run: expected rank 0 to exit 1 with the collective's Error after some "
    "steps (results ${rcs}, ${took} s): ${err}")
endif()
if(took GREATER 90)
  message(FATAL_ERROR "a peer killed mid-run: rank 0 took ${took} s to stop (timeout_s is 100)")
endif()
string(REGEX MATCH "[^\n]*over gloo failed[^\n]*" said "${err}")
message(STATUS "a peer killed mid-run: rank 0 stopped ${took} s after the start (rank 1 killed at 15 s): ${said}")


# 5. a reward model sharded over the 2 ranks
run_cli(rc err launch --nproc-per-node 2 -- train algorithm.name=grpo rollout.name=naive model.path=${FIXTURES}/models/llama
  data.train_files=[${FIXTURES}/data/prompts.jsonl] reward.name=model reward.model_path=${FIXTURES}/models/llama_rm
  reward.micro_batch_size=3 trainer.total_steps=2 trainer.output_dir=${WORK}/rm trainer.save_model=false
  data.train_batch_size=2 rollout.n=4 rollout.max_new_tokens=6 geometry.ppo_mini_batch_size=2
  geometry.micro_batch_size_per_gpu=4 optim.lr=1e-3 loader.epochs=0 loader.drop_last=true distributed.timeout_s=120)
if(NOT rc EQUAL 0 OR NOT err MATCHES "the reward model is sharded over 2 ranks")
  message(FATAL_ERROR "GRPO with a reward model on 2 ranks (${rc}): ${err}")
endif()
expect_last_metrics(${WORK}/rm 2 "the 2-rank reward-model run" "\"reward_mean\":-?[0-9]")

# 6. placement: ranks 0-1 generate and train, rank 2 holds the reference, ranks 1-2 the reward
#    model (sharded over them); a map past the world is refused before anything loads
run_cli(rc err launch --nproc-per-node 3 -- train algorithm.name=grpo rollout.name=naive model.path=${FIXTURES}/models/llama
  data.train_files=[${FIXTURES}/data/prompts.jsonl] reward.name=model reward.model_path=${FIXTURES}/models/llama_rm
  reward.micro_batch_size=3 trainer.total_steps=2 trainer.output_dir=${WORK}/placed trainer.save_model=false
  data.train_batch_size=2 rollout.n=4 rollout.max_new_tokens=6 geometry.ppo_mini_batch_size=2
  geometry.micro_batch_size_per_gpu=4 optim.lr=1e-3 loader.epochs=0 loader.drop_last=true distributed.timeout_s=120
  placement.actor=0-1 placement.reference=2 placement.reward=1-2)
if(NOT rc EQUAL 0 OR NOT err MATCHES "the reward model is sharded over 2 ranks"
   OR NOT err MATCHES "placement: actor 0-1, reference 2, reward 1-2 \\(ranks\\)"
   OR NOT err MATCHES "3 ranks \\(torchrun, gloo backend\\): data parallel 2 \\(placement.actor\\)")
  message(FATAL_ERROR "GRPO with placement.actor=0-1 reference=2 reward=1-2 on 3 ranks (${rc}): ${err}")
endif()
expect_last_metrics(${WORK}/placed 2 "the placed run" "\"reward_mean\":-?[0-9]" "\"kl\":")
# ... offline: DPO on ranks 0-1 with the reference on rank 2 (the pairs travel to it, its sums back)
run_cli(rc err launch --nproc-per-node 3 -- train algorithm.name=dpo model.path=${FIXTURES}/models/llama
  data.train_files=[${FIXTURES}/data/pairs.jsonl] data.train_batch_size=2 geometry.ppo_mini_batch_size=2
  trainer.total_steps=2 trainer.output_dir=${WORK}/placed_dpo trainer.save_model=false loader.epochs=0
  distributed.timeout_s=120 placement.actor=0-1 placement.reference=2)
if(NOT rc EQUAL 0 OR NOT err MATCHES "placement: actor 0-1, reference 2 \\(ranks\\)")
  message(FATAL_ERROR "DPO with placement.actor=0-1 reference=2 on 3 ranks (${rc}): ${err}")
endif()
expect_last_metrics(${WORK}/placed_dpo 2 "the placed DPO run" "\"dpo/loss\":")
# ... the placed run's checkpoint resumes (the scoring ranks load no state) and its third step is the
# uninterrupted run's
set(placed_args algorithm.name=grpo rollout.name=naive model.path=${FIXTURES}/models/llama
  data.train_files=[${FIXTURES}/data/prompts.jsonl] trainer.save_model=false data.train_batch_size=2 rollout.n=4
  rollout.max_new_tokens=6 geometry.ppo_mini_batch_size=2 geometry.micro_batch_size_per_gpu=4 optim.lr=1e-3
  loader.epochs=0 loader.drop_last=true distributed.timeout_s=120 placement.actor=0-1 placement.reference=2
  placement.reward=2)
run_cli(rc err launch --nproc-per-node 3 -- train ${placed_args} trainer.total_steps=2 trainer.output_dir=${WORK}/placed2)
run_cli(rc2 err2 launch --nproc-per-node 3 -- train ${placed_args} trainer.total_steps=3 trainer.output_dir=${WORK}/placed2)
run_cli(rc3 err3 launch --nproc-per-node 3 -- train ${placed_args} trainer.total_steps=3 trainer.output_dir=${WORK}/placed3)
if(NOT rc EQUAL 0 OR NOT rc2 EQUAL 0 OR NOT rc3 EQUAL 0 OR NOT err2 MATCHES "done, 3 steps \\(resumed from step 2\\)")
  message(FATAL_ERROR "a placed run resumed (${rc}, ${rc2}, ${rc3}): ${err2}")
endif()
file(STRINGS ${WORK}/placed2/metrics.jsonl resumed_lines)
file(STRINGS ${WORK}/placed3/metrics.jsonl straight_lines)
list(GET resumed_lines 2 resumed_3)
list(GET straight_lines 2 straight_3)
string(REGEX MATCH "\"kl\":[^,}]*" resumed_kl "${resumed_3}")
string(REGEX MATCH "\"kl\":[^,}]*" straight_kl "${straight_3}")
string(REGEX MATCH "\"loss\":[^,}]*" resumed_loss "${resumed_3}")
string(REGEX MATCH "\"loss\":[^,}]*" straight_loss "${straight_3}")
if(resumed_kl STREQUAL "" OR NOT resumed_kl STREQUAL straight_kl OR NOT resumed_loss STREQUAL straight_loss)
  message(FATAL_ERROR "the resumed placed run's step 3 (${resumed_kl} ${resumed_loss}) is not the uninterrupted "
    "run's (${straight_kl} ${straight_loss})")
endif()
message(STATUS "a placed run resumed at step 2: step 3 ${resumed_kl} ${resumed_loss}, as the uninterrupted run's")
run_cli(rc err launch --nproc-per-node 2 -- train ${args} trainer.total_steps=2 trainer.output_dir=${WORK}/badmap
  placement.reference=5)
if(rc EQUAL 0 OR NOT err MATCHES "placement.reference = \"5\" names rank 5, but the process group has 2 rank\\(s\\)"
   OR err MATCHES "tokenizer")
  message(FATAL_ERROR "placement.reference=5 on 2 ranks: expected a refusal before the tokenizer loads (${rc}): ${err}")
endif()

# 7. trainer.checkpoint_format=sharded on 2 processes: each rank writes its own shard file into the
#    directory rank 0 made (checkpoint_hf_weights adds the full weights); one process resumes it
run_cli(rc err launch --nproc-per-node 2 -- train ${args} trainer.total_steps=2 trainer.output_dir=${WORK}/sharded
  trainer.checkpoint_format=sharded trainer.checkpoint_hf_weights=true)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "2 ranks with trainer.checkpoint_format=sharded (${rc}): ${err}")
endif()
foreach(f shard_00000-of-00002.safetensors shard_00001-of-00002.safetensors model.safetensors config.json
    trainer_state.json trainer_state.safetensors)
  if(NOT EXISTS ${WORK}/sharded/checkpoints/step_00000002/${f})
    message(FATAL_ERROR "the sharded checkpoint of 2 ranks has no ${f}")
  endif()
endforeach()
file(READ ${WORK}/sharded/checkpoints/step_00000002/trainer_state.json sharded_state)
if(NOT sharded_state MATCHES "\"checkpoint_format\": \"sharded\"")
  message(FATAL_ERROR "trainer_state.json does not say sharded: ${sharded_state}")
endif()
run_cli(rc err train ${args} trainer.total_steps=3 trainer.output_dir=${WORK}/sharded)
if(NOT rc EQUAL 0 OR NOT err MATCHES "resumed from step 2")
  message(FATAL_ERROR "one process did not resume the 2-rank sharded checkpoint (${rc}): ${err}")
endif()
message(STATUS "a sharded checkpoint of 2 processes resumed on one")

# 8. sharding.name=tp3d: PPO over a tensor-parallel pair (policy and critic split, Rollout<Paged>
#    fed the full weights); the layout line says so; one process (TP 1) resumes its checkpoint
set(tp_args algorithm.name=ppo sharding.name=tp3d model.path=${FIXTURES}/models/llama
  data.train_files=[${FIXTURES}/data/prompts.jsonl] trainer.output_dir=${WORK}/tp trainer.save_model=false
  data.train_batch_size=2 rollout.n=4 rollout.max_new_tokens=6 geometry.ppo_mini_batch_size=2
  geometry.micro_batch_size_per_gpu=4 optim.lr=1e-3 loader.epochs=0 loader.drop_last=true distributed.timeout_s=120)
run_cli(rc err launch --nproc-per-node 2 -- train ${tp_args} sharding.tensor_parallel_size=2 trainer.total_steps=2)
if(NOT rc EQUAL 0 OR NOT err MATCHES "algorithm.name = ppo, rollout.name = paged, sharding.name = tp3d"
   OR NOT err MATCHES "2 ranks \\(torchrun, gloo backend\\): data parallel 1 x tensor parallel 2, Sharding<TP3D>")
  message(FATAL_ERROR "PPO with sharding.name=tp3d on 2 ranks (${rc}): ${err}")
endif()
expect_last_metrics(${WORK}/tp 2 "the TP3D PPO run" "\"critic/values_mean\":-?[0-9]")
run_cli(rc err train ${tp_args} trainer.total_steps=3)
if(NOT rc EQUAL 0 OR NOT err MATCHES "done, 3 steps \\(resumed from step 2\\)")
  message(FATAL_ERROR "one process did not resume the TP3D run's checkpoint (${rc}): ${err}")
endif()
message(STATUS "sharding.name=tp3d: PPO on a tensor-parallel pair, resumed on one process")

# 5. a peer that stalls (SIGSTOP after 8 s, SIGKILL 10 s later, from a shell: timeout -s STOP
# never sends its -k KILL to a stopped child): rank 0 waits in a collective for
# distributed.timeout_s = 5, then ends with an Error naming rank 1, before rank 1 is killed.
string(RANDOM LENGTH 4 ALPHABET 123456789 r)
math(EXPR port "20000 + ${r} % 20000")
set(env_common WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=${port})
string(TIMESTAMP t0 "%s")
execute_process(
  COMMAND sh -c "\"$0\" \"$@\" & pid=$!; sleep 8; kill -STOP $pid; sleep 10; kill -KILL $pid; wait $pid"
    env RANK=1 LOCAL_RANK=1 ${env_common}
    ${EXE} train ${args} trainer.output_dir=${WORK}/stalled trainer.total_steps=100000 loader.epochs=0 trainer.save_every=0
    distributed.timeout_s=5 distributed.store_timeout_s=60
  COMMAND ${CMAKE_COMMAND} -E env RANK=0 LOCAL_RANK=0 ${env_common}
    ${EXE} train ${args} trainer.output_dir=${WORK}/stalled trainer.total_steps=100000 loader.epochs=0 trainer.save_every=0
    distributed.timeout_s=5 distributed.store_timeout_s=60
  RESULTS_VARIABLE rcs OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
string(TIMESTAMP t1 "%s")
math(EXPR took "${t1} - ${t0}")
list(GET rcs 1 rc0)
if(NOT rc0 EQUAL 1 OR NOT err MATCHES "over gloo failed"
   OR NOT err MATCHES "rank 1 sent no report within 0.5 s of this failure: stalled or died before collective #[0-9]+")
  message(FATAL_ERROR "a stalled peer: expected rank 0 to exit 1 naming rank 1 (results ${rcs}, ${took} s): ${err}")
endif()
string(REGEX MATCH "[^\n]*over gloo failed[^\n]*" said "${err}")
message(STATUS "a stalled peer: rank 0 stopped within ${took} s of the start (rank 1 stopped at 8 s): ${said}")
