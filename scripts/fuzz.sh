#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/, Clang with ASan + UBSan, in build-fuzz/) and runs each
# for a while. A crash, a leak, a hang past -timeout or an allocation past -rss_limit_mb fails the
# script; the input is kept under build-fuzz/findings/<target>/.
#   ./scripts/fuzz.sh                      # every target, 20 s each (CI's short run)
#   ./scripts/fuzz.sh tokenizer_json 3600  # one target, an hour
#   ./scripts/fuzz.sh all 600              # every target, 10 minutes each
#   JOBS=1 NICE=19 ./scripts/fuzz.sh ...   # one build job; fuzz at the lowest priority
#   FUZZ_ARGS="-only_ascii=1" ./scripts/fuzz.sh jsonl 60   # more libFuzzer flags
#   NO_BUILD=1 ./scripts/fuzz.sh ...       # run what build-fuzz/ holds
# Each target fuzzes a working corpus of its own, build-fuzz/corpus/<target>/, which starts as a
# copy of the committed seeds (tests/fuzz/corpus/<target>/) and keeps what earlier runs found, so
# the seeds in git stay small; tests/fuzz/<target>.dict holds its keywords. Regenerate the seeds
# with tests/fuzz/make_corpus.py.
set -euo pipefail
cd "$(dirname "$0")/.."

ALL_TARGETS="safetensors config_json tokenizer_json jsonl yaml_config checkpoint_dir"
target=${1:-all}
seconds=${2:-20}
[[ $target == all ]] && targets=$ALL_TARGETS || targets=$target
for t in $targets; do
  [[ " $ALL_TARGETS " == *" $t "* ]] || { echo "usage: $0 [all | ${ALL_TARGETS// / | }] [seconds]" >&2; exit 2; }
done

BUILD_DIR=${BUILD_DIR:-build-fuzz}
JOBS=${JOBS:-$(nproc)}
NICE=${NICE:-0}
CXX_FUZZ=${CXX_FUZZ:-clang++}

if [[ -z "${NO_BUILD:-}" ]]; then
  if ! command -v "$CXX_FUZZ" >/dev/null && [[ $CXX_FUZZ == clang++ ]]; then
    echo "== installing: clang (libFuzzer comes with it)"
    sudo_cmd=()
    if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
    "${sudo_cmd[@]}" apt-get update -q
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q clang
  fi
  command -v "$CXX_FUZZ" >/dev/null || { echo "fuzz.sh: $CXX_FUZZ not found (Debian: apt-get install clang)" >&2; exit 1; }
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  echo "== configure ($BUILD_DIR, $CXX_FUZZ)"
  # Debug: -O1 is the targets' own, and assertions (nlohmann-json's, libstdc++'s) stay on
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_CXX_COMPILER="$CXX_FUZZ" -DCMAKE_BUILD_TYPE=Debug \
    -DHYBRIDRL_FUZZ=ON "${launcher[@]}" >/dev/null
  echo "== build"
  build_targets=()
  for t in $targets; do build_targets+=("hybridrl_fuzz_$t"); done
  nice -n "$NICE" cmake --build "$BUILD_DIR" -j "$JOBS" --target "${build_targets[@]}"
fi

# longest input per target: a few KB covers every structure the seeds show (a tokenizer.json of
# 300 tokens is ~6 KB); larger inputs only slow each execution
max_len() {
  case $1 in
    tokenizer_json) echo 16384 ;;
    checkpoint_dir) echo 8192 ;;
    *) echo 4096 ;;
  esac
}

# every finding aborts with a report; leaks are findings (libFuzzer checks them per input)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export OMP_NUM_THREADS=1  # LibTorch's thread pool: one thread per fuzzing process

failed=()
summary=()
for t in $targets; do
  exe="$BUILD_DIR/tests/fuzz/hybridrl_fuzz_$t"
  corpus="$BUILD_DIR/corpus/$t"
  findings="$BUILD_DIR/findings/$t"
  log="$BUILD_DIR/logs/$t.log"
  mkdir -p "$corpus" "$findings" "$(dirname "$log")"
  cp -n tests/fuzz/corpus/"$t"/* "$corpus"/ 2>/dev/null || true
  echo "== fuzz $t for ${seconds} s (log: $log)"
  rc=0
  # the target's keywords (field names, component types), which mutations insert whole
  nice -n "$NICE" "$exe" -max_total_time="$seconds" -max_len="$(max_len "$t")" -timeout=10 -rss_limit_mb=2048 \
    -dict="tests/fuzz/$t.dict" -print_final_stats=1 -artifact_prefix="$findings/" ${FUZZ_ARGS:-} "$corpus" \
    >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  files=$(find "$corpus" -type f | wc -l)
  bytes=$(du -sb "$corpus" | cut -f1)
  if [[ $rc -ne 0 ]]; then
    failed+=("$t")
    echo "   FAILED (exit $rc): the end of $log:"
    tail -40 "$log" | sed 's/^/   /'
    summary+=("$t: FAILED, ${execs:-?} executions in ${seconds} s; findings in $findings/")
  else
    summary+=("$t: ${execs:-?} executions in ${seconds} s (${rate:-?}/s), corpus $files files, $bytes bytes")
  fi
done
echo "== summary"
printf '%s\n' "${summary[@]}"
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzz.sh: findings in: ${failed[*]}" >&2
  exit 1
fi
