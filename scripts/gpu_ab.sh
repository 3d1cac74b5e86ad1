#!/usr/bin/env bash
# Base against new on one GPU machine, back to back (docs/benchmarks.md's "A/B on one machine"
# tables): the working tree ("new", in build-gpu, built by scripts/gpu_check.sh) against the same
# tree with an earlier commit's library files ("base"), so a change is timed without the spread
# between machines of one kind.
#   scripts/gpu_ab.sh prepare <ref>      # here (git): writes .ab-base/ — <ref>'s version of each file
#                                        # under include/ src/ cmake/ bench/ apps/ and CMakeLists.txt
#                                        # that differs from the working tree; carry it (device
#                                        # tool: carry=[".ab-base"])
#   scripts/gpu_ab.sh run [benchmarks]   # there, after gpu_check.sh built bench_rollout bench_train:
#                                        # builds the base beside ($AB_BASE, default
#                                        # /tmp/hybridrl-ab-base), then runs each benchmark base,
#                                        # then new; JSON lines tagged "ab" on stdout and $OUT/ab.jsonl
#                                        # (AB_REUSE=1: keep a base built by an earlier call there)
# Benchmarks: generate-160m generate-1b (Rollout<Paged>, B = 256) update-160m update-1b (16 x 1024
# tokens, AdamW) grpo-160m (3 steps); default: the first four.
set -euo pipefail
cd "$(dirname "$0")/.."
cmd=${1:-}
shift || true
case "$cmd" in
  prepare)
    ref=${1:?usage: $0 prepare <ref>}
    rm -rf .ab-base && mkdir -p .ab-base/files
    paths=(include src cmake bench apps CMakeLists.txt)
    git diff --name-only --diff-filter=AMR "$ref" -- "${paths[@]}" > .ab-base/changed  # in the tree, not as in <ref>
    git diff --name-only --diff-filter=D "$ref" -- "${paths[@]}" >> .ab-base/changed
    : > .ab-base/removed
    while read -r f; do
      if git cat-file -e "$ref:$f" 2>/dev/null; then
        mkdir -p ".ab-base/files/$(dirname "$f")" && git show "$ref:$f" > ".ab-base/files/$f"
      else
        echo "$f" >> .ab-base/removed  # added since <ref>: not in the base
      fi
    done < .ab-base/changed
    git rev-parse "$ref" > .ab-base/ref
    echo "base = $(cat .ab-base/ref): $(wc -l < .ab-base/changed) files differ ($(wc -l < .ab-base/removed) added since)"
    ;;
  run)
    [[ -d .ab-base/files ]] || { echo "no .ab-base/: run '$0 prepare <ref>' where git is, and carry .ab-base" >&2; exit 2; }
    OUT=${OUT:-$PWD/gpu-logs}
    mkdir -p "$OUT"
    base=${AB_BASE:-/tmp/hybridrl-ab-base}
    benches=("$@")
    ((${#benches[@]} == 0)) && benches=(generate-160m generate-1b update-160m update-1b)
    targets=()  # the bench programs the benchmarks need
    for b in "${benches[@]}"; do
      case "$b" in
        generate-*) t=bench_rollout ;;
        update-* | grpo-*) t=bench_train ;;
        *) echo "unknown benchmark '$b' (generate-160m generate-1b update-160m update-1b grpo-160m ...)" >&2; exit 2 ;;
      esac
      [[ " ${targets[*]} " == *" $t "* ]] || targets+=("$t")
    done
    if [[ ${AB_REUSE:-0} != 1 || ! -d $base/build/bench ]]; then
      rm -rf "$base" && mkdir -p "$base"
      tar --exclude='./build*' --exclude=./.ab-base --exclude=./gpu-logs -cf - . | (cd "$base" && tar xf -)
      cp -a .ab-base/files/. "$base/"
      while read -r f; do rm -f "$base/$f"; done < .ab-base/removed
      TORCH_PREFIX=${TORCH_PREFIX:-$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')}
      cmake -S "$base" -B "$base/build" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=$TORCH_PREFIX" \
        -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90} > "$OUT/ab-configure.log" 2>&1
    fi
    t0=$(date +%s)
    cmake --build "$base/build" -j "$(nproc)" --target "${targets[@]}" > "$OUT/ab-build.log" 2>&1 ||
      { echo "the base did not build: $OUT/ab-build.log" >&2; tail -20 "$OUT/ab-build.log" >&2; exit 1; }
    echo "base ($(cat .ab-base/ref)) built in $(($(date +%s) - t0)) s" >&2
    for b in "${benches[@]}"; do
      for which in base new; do
        dir=build-gpu/bench
        [[ $which == base ]] && dir=$base/build/bench
        case "$b" in
          generate-*) run=(env BENCH_GENERATE_ENGINES=paged "$dir/bench_rollout" generate "${b#generate-}" 256) ;;
          update-*) run=("$dir/bench_train" update "${b#update-}" 16) ;;
          grpo-*) run=("$dir/bench_train" grpo "${b#grpo-}" 3) ;;
        esac
        "${run[@]}" 2> "$OUT/ab-$b-$which.err" | grep '^{' | sed "s/^{/{\"ab\": \"$which\", /" | tee -a "$OUT/ab.jsonl" ||
          echo "{\"ab\": \"$which\", \"bench\": \"$b\", \"error\": \"exit status, see ab-$b-$which.err\"}" | tee -a "$OUT/ab.jsonl"
      done
    done
    ;;
  *)
    echo "usage: $0 prepare <ref> | run [benchmarks...]" >&2
    exit 2
    ;;
esac
