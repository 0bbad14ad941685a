#!/usr/bin/env bash
# The GPU run, from the bundle tools/gpu/gpu-pack.sh made (.gpu/), in one
# command on the GPU machine (a device call with carry [".gpu"], from the
# repository root; docs/gpu.md):
#
#   bash tools/gpu/gpu-check.sh "$OUT"            # everything (may not fit 10 min)
#   bash tools/gpu/gpu-check.sh "$OUT" --part 1   # tests + kernel benchmark
#   bash tools/gpu/gpu-check.sh "$OUT" --part 2   # training runs, PyTorch, sanitizers
#   bash tools/gpu/gpu-check.sh "$OUT" --part 3   # the data-parallel path on one GPU
#   bash tools/gpu/gpu-check.sh "$OUT" --part 4   # ResNet-18 in each framework's defaults (TF32 convs)
#   bash tools/gpu/gpu-check.sh "$OUT" --part 5   # accuracy in TF32: LeNet 3 seeds, ResNet-18 best
#   bash tools/gpu/gpu-check.sh "$OUT" --part 6   # the baselines run, <= 8 min (docs/gpu.md)
#   bash tools/gpu/gpu-check.sh "$OUT" --part sanitizers   # part 2's sanitizer steps alone
#
# writes OUTDIR/report.md and OUTDIR/figures.json, plus the logs behind them
# (tests.log, bench.log, train.log, sanitizer.log: at most 6 files, as a
# device call brings back 8). Part 1: nvidia-smi, the library check, the whole
# test suite (anvil-tests, and anvil-parallel-tests' NCCL tests; the CUDA
# tests, which skip without a GPU, run), the kernel
# benchmark's smoke test, then bench_cuda_kernels (every GEMM and conv rung
# checked, then timed against cuBLAS and cuDNN). Part 2: LeNet's seed recipe
# for 10 epochs and one ResNet-18 epoch on cuda:0, the same two runs by
# PyTorch on the same GPU (scripts/torch_gpu_recipes.py) for the ratios, and
# compute-sanitizer memcheck and racecheck over the CUDA tests. Part 3 (not
# in "all": it would not fit): the overhead of the data-parallel path, 3
# LeNet epochs and 1 ResNet-18 epoch each with --gpus 1 (one replica, its
# own thread and streams, buckets and all-reduce) against --device cuda:0.
# Part 6 (not in "all"), the baselines run, one command of at most 8
# minutes: the GEMM and conv rungs that matter against cuBLAS and cuDNN in
# FP32, TF32 and BF16 on the training's own shapes, ResNet-18 2 epochs by
# anvil (TF32; --amp bf16; with --profile where anvil-train has it) and by
# PyTorch (its defaults; its best), and racecheck over the tensor-core
# rungs' tests alone.
#
# Without a GPU (here) it runs what it can from the bundle alone, with the
# same environment: the library check, the whole test suite (CUDA tests skip),
# the smoke test, and a small CPU run of each training command instead of the
# GPU one; the GPU steps say that no GPU is present. Each step has a time
# limit and the whole check a deadline (ANVIL_GPU_CHECK_SECONDS, 570 s with a
# GPU: a device command may run 10 minutes); a step that would pass it is
# reported as not run. The report is rewritten after every step, so a check
# stopped early still leaves one. Exits 0 when every step that ran passed.
# ANVIL_GPU_CHECK_TESTS=EXPR runs only the tests matching a Catch2 tag
# expression (CI's short rehearsal: "[gemm]"), not the whole suite.
set -uo pipefail
cd "$(dirname "$0")/../.."
usage="usage: bash tools/gpu/gpu-check.sh OUTDIR [--part 1|2|3|4|5|6|all|sanitizers]"
out=${1:?$usage}
part=all
if [[ $# -ge 3 && "$2" == "--part" ]]; then part=$3; fi
[[ "$part" =~ ^(1|2|3|4|5|6|all|sanitizers)$ ]] || { echo "$usage" >&2; exit 2; }
pack=${ANVIL_GPU_PACK:-.gpu}  # where gpu-pack.sh put the bundle
start=$SECONDS
# bin/ and lib/ come packed (bundle.tar.xz, unpacked into $pack/unpacked for
# this run and removed at its end, so that the folder stays small enough to
# carry), or, from gpu-pack.sh --reuse, as they are.
files=$pack
if [[ -f "$pack/bundle.tar.xz" ]]; then
  files=$pack/unpacked
  rm -rf "$files"
  mkdir -p "$files"
  trap 'rm -rf "$files"' EXIT
  if command -v xz >/dev/null; then
    tar -C "$files" -xJf "$pack/bundle.tar.xz"
  else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
      "$pack/bundle.tar.xz" "$files"
  fi
fi
if [[ ! -x "$files/bin/anvil-tests" ]]; then
  echo "gpu-check: no bundle in $pack/: run bash tools/gpu/gpu-pack.sh first (and carry .gpu)" >&2
  exit 2
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d /tmp/anvil-gpu-check.XXXXXX)
export pack files work ANVIL_GPU_PACK=$pack  # the step functions below run in child shells

# ---- the environment (the same with and without a GPU) ----
# The bundle's libraries first, then the CUDA libraries of the image: its
# CUDA toolkit and its Python packages (nvidia-cublas, nvidia-cudnn-cu13,
# nvidia-nccl-cu13, ...), where cuBLAS, cuDNN and NCCL are.
lib_path="$(cd "$files" && pwd)/lib"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d "$d" ]] && lib_path+=":$d"
done
python=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import torch' 2>/dev/null; then python=$p; break; fi
done
for p in $python python3; do
  dirs=$("$p" - 2>/dev/null <<'EOF'
import os
try:
    import nvidia
except ImportError:
    raise SystemExit
for root in nvidia.__path__:
    for d in sorted(os.listdir(root)):
        if os.path.isdir(os.path.join(root, d, "lib")):
            print(os.path.join(root, d, "lib"))
EOF
) || true
  for d in $dirs; do lib_path+=":$d"; done
  [[ -n "$dirs" ]] && break
done
export LD_LIBRARY_PATH="$lib_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMP_WAIT_POLICY=passive  # as the test presets
data="$(cd "$pack" && pwd)/data/fashion-mnist"

gpu=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  gpu=1
  # A GPU is listed, so a CUDA test that finds no usable device (no driver,
  # a driver too old, none visible) fails, naming why, instead of skipping:
  # this run cannot pass by running nothing (tests/cuda_test_util.h).
  export ANVIL_REQUIRE_CUDA=1
fi
# Part 6 is planned as one command of at most 8 minutes: 470 s of steps.
deadline=${ANVIL_GPU_CHECK_SECONDS:-$((gpu ? (part == 6 ? 470 : 570) : 7200))}
# The tests read Fashion-MNIST from the Debian package's folder; give them the
# bundle's copy there if it is missing and the folder can be made (root).
system_data=/usr/share/datasets/fashion-mnist
if [[ ! -f "$system_data/train-images-idx3-ubyte.gz" && ! -f "$system_data/train-images-idx3-ubyte" ]]; then
  if mkdir -p "$system_data" 2>/dev/null; then
    for f in "$data"/*.gz; do ln -sf "$f" "$system_data/"; done
    echo "data: linked the bundle's Fashion-MNIST into $system_data" >>"$work/notes"
  else
    echo "data: $system_data is missing and cannot be made: the Fashion-MNIST tests use synthetic data or skip" >>"$work/notes"
  fi
fi
{
  echo "gpu=$gpu part=$part"
  if ((gpu)); then
    echo "ANVIL_REQUIRE_CUDA=1: nvidia-smi lists a GPU, so a CUDA test that finds no usable device fails"
  else
    echo "ANVIL_REQUIRE_CUDA unset: nvidia-smi lists no GPU, so the CUDA tests skip (no device here)"
  fi
  [[ -n "${ANVIL_GPU_CHECK_TESTS:-}" ]] && echo "tests: only $ANVIL_GPU_CHECK_TESTS (ANVIL_GPU_CHECK_TESTS), not the whole suite"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "python=${python:-none}"
} >>"$work/notes"

# ---- steps ----
# step NAME LOG SECONDS COMMAND...: runs COMMAND with a time limit, appending
# its output to $work/LOG, and records NAME, status, seconds in steps.tsv.
step() {
  local name=$1 log=$2 limit=$3
  shift 3
  local left=$((deadline - (SECONDS - start)))
  if ((left < limit / 2)); then
    printf '%s\tnot run\t0\t%s\n' "$name" "would pass the deadline ($deadline s); run the other --part on its own" >>"$work/steps.tsv"
    report
    return 0
  fi
  ((limit > left)) && limit=$left
  echo "== $name (limit ${limit} s)" | tee -a "$work/$log"
  local t0=$SECONDS rc=0
  if declare -F "$1" >/dev/null; then  # a function of this script: timeout runs programs
    timeout --kill-after=10 "$limit" bash -c "$(declare -f); \"\$@\"" _ "$@" \
      >>"$work/$log" 2>&1 || rc=$?
  else
    timeout --kill-after=10 "$limit" "$@" >>"$work/$log" 2>&1 || rc=$?
  fi
  local status=ok
  ((rc == 124 || rc == 137)) && status="timed out"
  ((rc != 0 && rc != 124 && rc != 137)) && status="failed (exit $rc)"
  printf '%s\t%s\t%s\t\n' "$name" "$status" "$((SECONDS - t0))" >>"$work/steps.tsv"
  echo "   $status in $((SECONDS - t0)) s" | tee -a "$work/$log"
  report
}
skip() {  # skip NAME WHY
  printf '%s\tnot run\t0\t%s\n' "$1" "$2" >>"$work/steps.tsv"
  report
}
report() {
  "${python:-python3}" tools/gpu/gpu_report.py "$work" "$out" >/dev/null 2>"$work/report.err" ||
    { echo "gpu-check: the report failed:" >&2; cat "$work/report.err" >&2; }
}
libcheck() {  # every library resolves: from the bundle, or one the GPU image has
  local bad=0 image lib_dir name path
  image=$(sed -n 's/^image libraries: //p' "$pack/MANIFEST")
  lib_dir=$(cd "$files/lib" && pwd)
  for exe in "$files"/bin/*; do
    echo "$exe:"
    while read -r name _ path _; do
      if [[ "$path" == "not" ]]; then
        echo "  $name: NOT FOUND"; bad=1
      elif [[ "$path" == "$lib_dir"/* ]]; then
        echo "  $name: the bundle's"
      elif [[ -n "$image" && "$name" =~ $image ]]; then
        echo "  $name: $path (one the GPU image has)"
      else
        echo "  $name: $path: NOT IN THE BUNDLE (the GPU image may lack it)"; bad=1
      fi
    done < <(ldd "$exe" | awk '/=>/ {print $1, $2, $3, $4}')
  done
  return $bad
}
gpu_tests() {  # the tests that use the GPU, one after the other
  local only=$1 rc=0
  "$files/bin/anvil-tests" "$only[cuda]" >"$work/tests-cuda.log" 2>&1 || rc=$?
  # A filter that selects no NCCL test (CI's short form) skips this half: the
  # runner fails a filter that matches nothing.
  if [[ -x "$files/bin/anvil-parallel-tests" ]] &&
     "$files/bin/anvil-parallel-tests" "$only[nccl]" --list-test-names-only 2>/dev/null |
       grep -q '[^[:space:]]'; then
    "$files/bin/anvil-parallel-tests" "$only[nccl]" >"$work/tests-nccl.log" 2>&1 || rc=$?
  fi
  return $rc
}
tests_both() {  # the GPU's tests and the rest, side by side
  local only=${ANVIL_GPU_CHECK_TESTS:-}  # a tag expression: CI's short form
  gpu_tests "$only" &
  local gpu_pid=$! rc=0
  "$files/bin/anvil-tests" "$only~[cuda]" >"$work/tests-other.log" 2>&1 || rc=$?
  wait $gpu_pid || rc=$((rc ? rc : $?))
  local half
  for half in cuda nccl other; do
    [[ -f "$work/tests-$half.log" ]] || continue
    echo "--- tests-$half"
    cat "$work/tests-$half.log"
  done
  return $rc
}
sanitizer() {  # sanitizer TOOL [TESTS]: compute-sanitizer over the CUDA tests (or TESTS, a Catch2 spec)
  # Kernel errors only: the tests' own checks see every CUDA API error, and
  # some tests cause them on purpose (an allocation too large, an injected
  # failure). racecheck slows a test tens of times, so the test cases run in
  # shards, one process each, side by side on the one GPU (Catch2's -f).
  local cs shards=${ANVIL_GPU_SANITIZER_SHARDS:-6} rc=0 i
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer \
       /opt/nvidia/*/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
  [[ -n "$cs" ]] || { echo "compute-sanitizer not found"; return 3; }
  # Each name a test spec: its commas, brackets and the like escaped.
  "$files/bin/anvil-tests" "${2:-[cuda]}" --list-test-names-only | grep '[^[:space:]]' |
    sed 's/[],[\\"~*]/\\&/g' | awk -v n="$shards" -v dir="$work" '{ print > (dir "/shard-" (NR - 1) % n) }'
  local pids=()
  for ((i = 0; i < shards; ++i)); do
    [[ -s "$work/shard-$i" ]] || continue
    "$cs" --tool "$1" --report-api-errors no --error-exitcode 99 \
      "$files/bin/anvil-tests" -f "$work/shard-$i" >"$work/shard-$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || rc=$?; done
  for ((i = 0; i < shards; ++i)); do
    [[ -f "$work/shard-$i.log" ]] && { echo "--- shard $i"; cat "$work/shard-$i.log"; }
  done
  rm -f "$work"/shard-*
  return $rc
}

: >"$work/steps.tsv"
step "environment: nvidia-smi" nvidia-smi.txt 30 bash -c \
  'if command -v nvidia-smi >/dev/null; then nvidia-smi; nvidia-smi -L; else echo "nvidia-smi: not installed (no GPU)"; fi; uname -srm; lscpu | grep -E "^(Model name|CPU\(s\)):"'
step "environment: every library of the bundle resolves" libs.log 30 libcheck

if [[ "$part" == 1 || "$part" == all ]]; then
  step "tests: the whole suite (anvil-tests)" tests.log 330 tests_both
  step "tests: bench_cuda_kernels --smoke" tests.log 60 "$files/bin/bench_cuda_kernels" --smoke
  if ((gpu)); then
    step "bench_cuda_kernels: GEMM and conv rungs vs cuBLAS/cuDNN" bench.log 300 \
      "$files/bin/bench_cuda_kernels"
  else
    skip "bench_cuda_kernels: GEMM and conv rungs vs cuBLAS/cuDNN" "no GPU (nvidia-smi lists none)"
  fi
fi

if [[ "$part" == 2 || "$part" == all ]]; then
  # FP32 on both sides: anvil's FP32 rungs against PyTorch with TF32 off.
  train=("$files/bin/anvil-train" --recipe seed --fp32-precision ieee --data-dir "$data")
  torch_run=("$python" scripts/torch_gpu_recipes.py --data-dir "$data")
  if ((gpu)); then
    step "anvil: LeNet, seed recipe, 10 epochs on cuda:0" train.log 200 \
      "${train[@]}" --model lenet --device cuda:0 --metrics "$work/anvil-lenet.jsonl"
    step "anvil: ResNet-18, seed recipe, 2 epochs on cuda:0" train.log 200 \
      "${train[@]}" --model resnet18 --epochs 2 --device cuda:0 --metrics "$work/anvil-resnet18.jsonl"
  else
    step "anvil: LeNet (no GPU: 1 epoch of 2048 images on cpu instead)" train.log 300 \
      "${train[@]}" --model lenet --epochs 1 --limit-train 2048 --limit-test 512 --device cpu \
      --metrics "$work/anvil-lenet.jsonl"
    step "anvil: ResNet-18 (no GPU: 1 epoch of 64 images on cpu instead)" train.log 300 \
      "${train[@]}" --model resnet18 --epochs 1 --limit-train 64 --limit-test 64 --device cpu \
      --metrics "$work/anvil-resnet18.jsonl"
  fi
  if [[ -z "$python" ]]; then
    skip "pytorch: the same recipes" "no python3 with torch found"
  elif ((gpu)); then
    step "pytorch: LeNet, seed recipe, 10 epochs on cuda:0" train.log 200 bash -c \
      '"$@" > "'"$work"'/torch-lenet.jsonl"' _ "${torch_run[@]}" --model lenet --epochs 10 --device cuda:0
    step "pytorch: ResNet-18, seed recipe, 2 epochs on cuda:0" train.log 200 bash -c \
      '"$@" > "'"$work"'/torch-resnet18.jsonl"' _ "${torch_run[@]}" --model resnet18 --epochs 2 --device cuda:0
  else
    step "pytorch: LeNet (no GPU: 1 epoch of 2048 images on cpu instead)" train.log 300 bash -c \
      '"$@" > "'"$work"'/torch-lenet.jsonl"' _ "${torch_run[@]}" --model lenet --epochs 1 \
      --limit-train 2048 --limit-test 512 --device cpu
    step "pytorch: ResNet-18 (no GPU: 1 epoch of 64 images on cpu instead)" train.log 300 bash -c \
      '"$@" > "'"$work"'/torch-resnet18.jsonl"' _ "${torch_run[@]}" --model resnet18 --epochs 1 \
      --limit-train 64 --limit-test 64 --device cpu
  fi
fi

if [[ "$part" == 2 || "$part" == all || "$part" == sanitizers ]]; then
  if ((gpu)); then
    step "compute-sanitizer memcheck over the CUDA tests" sanitizer.log 150 sanitizer memcheck
    step "compute-sanitizer racecheck over the CUDA tests" sanitizer.log 150 sanitizer racecheck
  else
    skip "compute-sanitizer memcheck and racecheck over the CUDA tests" "no GPU (nvidia-smi lists none)"
  fi
fi

if [[ "$part" == 4 ]]; then
  # Each framework as a user gets it: anvil-train's default and PyTorch's
  # both run convolutions in TF32 (tensor cores) and matmuls in FP32.
  # ResNet-18 only (LeNet's step is too small for its convolutions to matter).
  train=("$files/bin/anvil-train" --recipe seed --fp32-precision default --data-dir "$data")
  torch_run=("$python" scripts/torch_gpu_recipes.py --fp32-precision default --data-dir "$data")
  if ((gpu)) && [[ -n "$python" ]]; then
    step "anvil: ResNet-18, seed recipe, 2 epochs on cuda:0, its defaults" train.log 100 \
      "${train[@]}" --model resnet18 --epochs 2 --device cuda:0 --metrics "$work/anvil-resnet18-defaults.jsonl"
    step "pytorch: ResNet-18, seed recipe, 2 epochs on cuda:0, its defaults" train.log 100 bash -c \
      '"$@" > "'"$work"'/torch-resnet18-defaults.jsonl"' _ "${torch_run[@]}" --model resnet18 --epochs 2 --device cuda:0
  else
    skip "anvil and PyTorch with their defaults (TF32 convolutions)" "no GPU, or no python3 with torch"
  fi
fi

if [[ "$part" == 5 ]]; then
  # TF32 training's accuracy (convolutions and matmuls on the tensor cores):
  # ResNet-18's best recipe, 15 epochs, with LeNet's seed recipe from 3 seeds
  # beside it on the same GPU (accuracy only: neither run's time is a figure).
  tf32_accuracy() {  # tf32_accuracy DATA_DIR (a step's function sees only exported names)
    local train=("$files/bin/anvil-train" --fp32-precision tf32 --data-dir "$1" --device cuda:0)
    (for seed in 0 1 2; do
       "${train[@]}" --model lenet --recipe seed --seed $seed \
         --metrics "$work/anvil-lenet-tf32-seed$seed.jsonl" > "$work/lenet-seed$seed.log" 2>&1
     done) &
    local lenet=$! rc=0
    "${train[@]}" --model resnet18 --recipe best --metrics "$work/anvil-resnet18-best-tf32.jsonl" || rc=$?
    wait $lenet || rc=$((rc ? rc : $?))
    cat "$work"/lenet-seed*.log
    return $rc
  }
  if ((gpu)); then
    step "anvil: TF32 accuracy: ResNet-18 best recipe 15 epochs, LeNet seed recipe seeds 0-2" \
      train.log 300 tf32_accuracy "$data"
  else
    skip "anvil: TF32 accuracy runs" "no GPU (nvidia-smi lists none)"
  fi
fi

if [[ "$part" == 6 ]]; then
  # The baselines run, one command of at most 8 minutes (docs/gpu.md):
  # anvil's kernels against true cuBLAS BF16 / TF32 and cuDNN FP32 / TF32 /
  # BF16 on the training's own convolutions; ResNet-18 trained 2 epochs by
  # anvil (TF32, its default; --amp bf16) and by PyTorch (its defaults; its
  # best: AMP bf16 + channels_last + cudnn.benchmark), both timing their
  # loader and not their test pass, compared after the first epoch;
  # racecheck over the tensor-core rungs' tests alone.
  bench=("$files/bin/bench_cuda_kernels" --repeats 10)
  train=("$files/bin/anvil-train" --model resnet18 --recipe seed --epochs 2 --data-dir "$data"
         --device cuda:0)
  torch_run=("$python" scripts/torch_gpu_recipes.py --model resnet18 --epochs 2 --data-dir "$data"
             --device cuda:0)
  # anvil-train --profile prints where an epoch's time goes; a build without
  # the flag trains without it, and the report says --profile did not run.
  profile=()
  if "$files/bin/anvil-train" --help 2>/dev/null | grep -q -- '--profile'; then profile=(--profile); fi
  racecheck_tests=${ANVIL_GPU_RACECHECK_TESTS:-cuda gemm mma:*,cuda conv mma:*}
  # From the best FP32 rung (GEMM 8, conv 5, the shipped one) to the
  # ladder's last, however many there are now (the benchmark names its
  # range when asked for a rung it lacks).
  top() {  # top FAMILY DEFAULT
    local n
    n=$("$files/bin/bench_cuda_kernels" "$1" 999 2>&1 | sed -n 's/.* has rungs 1 to \([0-9]*\),.*/\1/p')
    [[ -n "$n" ]] || { n=$2; echo "part 6: bench_cuda_kernels named no $1 range; rungs up to $2" >>"$work/notes"; }
    echo "$n"
  }
  gemm_rungs=$(seq -s, 8 "$(top gemm 12)")
  conv_rungs=$(seq -s, 5 "$(top conv 9)")
  if ((gpu)); then
    step "bench_cuda_kernels gemm: rungs $gemm_rungs at 2048 and 4096 vs cuBLAS FP32, TF32, BF16" \
      bench.log 60 "${bench[@]}" gemm --rungs "$gemm_rungs" --gemm-sizes 2048,4096
    # ... and the fastest rung per layer, direction and arithmetic, as
    # kernels/cuda/conv/rung_table.inc (docs/gpu.md: commit it there).
    step "bench_cuda_kernels conv: rungs $conv_rungs, the training's convolutions vs cuDNN FP32, TF32, BF16" \
      bench.log 150 "${bench[@]}" conv --rungs "$conv_rungs" --conv-set training \
      --write-rung-table "$out/rung_table.inc"
    ((${#profile[@]})) || skip "anvil-train --profile" "not run: this anvil-train has no --profile flag"
    step "anvil: ResNet-18, seed recipe, 2 epochs on cuda:0, TF32 (its default)${profile[*]:+, ${profile[*]}}" train.log 70 \
      "${train[@]}" "${profile[@]}" --metrics "$work/anvil-resnet18-tf32.jsonl"
    step "anvil: ResNet-18, seed recipe, 2 epochs on cuda:0, --amp bf16${profile[*]:+, ${profile[*]}}" train.log 70 \
      "${train[@]}" --amp bf16 "${profile[@]}" --metrics "$work/anvil-resnet18-bf16.jsonl"
    if [[ -n "$python" ]]; then
      step "pytorch: ResNet-18, seed recipe, 2 epochs on cuda:0, its defaults" train.log 70 bash -c \
        '"$@" > "'"$work"'/torch-resnet18-defaults.jsonl"' _ "${torch_run[@]}" --fp32-precision default
      step "pytorch: ResNet-18, seed recipe, 2 epochs on cuda:0, its best (AMP bf16, channels_last, cudnn.benchmark)" \
        train.log 70 bash -c '"$@" > "'"$work"'/torch-resnet18-best.jsonl"' _ "${torch_run[@]}" --best
    else
      skip "pytorch: ResNet-18 at its defaults and at its best" "no python3 with torch found"
    fi
    # The same TF32 run with the backend's TF32 convolutions on conv rung 6,
    # the single-stage rung the multistage rung 9 replaced as the default
    # (kernels/cuda/conv/conv.h: tf32_conv_rung): the step's change, measured.
    step "anvil: ResNet-18, seed recipe, 2 epochs on cuda:0, TF32 on conv rung 6 (ANVIL_CONV_TF32_RUNG=6)" \
      train.log 60 env ANVIL_CONV_TF32_RUNG=6 "${train[@]}" \
      --metrics "$work/anvil-resnet18-tf32-conv6.jsonl"
    # The simulator's stream capture against the GPU's runtime: the same
    # tests, whose expected errors come from CUDA's documentation.
    step "anvil-tests [graph]: stream capture and graphs on the GPU's runtime" tests.log 20 \
      env ANVIL_REQUIRE_CUDA=1 "$files/bin/anvil-tests" "[graph]"
    step "compute-sanitizer racecheck over the tensor-core rungs' tests ($racecheck_tests)" \
      sanitizer.log 90 sanitizer racecheck "$racecheck_tests"
  else
    skip "the baselines run (kernels vs cuBLAS/cuDNN, ResNet-18 vs PyTorch, racecheck)" \
      "no GPU (nvidia-smi lists none)"
  fi
fi

if [[ "$part" == 3 ]]; then
  # The same runs through both paths; the report sets their s/epoch side by
  # side (anvil-*-dp-device against anvil-*-dp-gpus1).
  train=("$files/bin/anvil-train" --recipe seed --data-dir "$data")
  if ((gpu)); then
    for path in device gpus1; do
      how=(--device cuda:0)
      [[ $path == gpus1 ]] && how=(--gpus 1)
      step "anvil: LeNet, seed recipe, 3 epochs, ${how[*]}" train.log 120 \
        "${train[@]}" --model lenet --epochs 3 "${how[@]}" --metrics "$work/anvil-lenet-dp-$path.jsonl"
      step "anvil: ResNet-18, seed recipe, 1 epoch, ${how[*]}" train.log 150 \
        "${train[@]}" --model resnet18 --epochs 1 "${how[@]}" --metrics "$work/anvil-resnet18-dp-$path.jsonl"
    done
    # The profile of the steady steps by op family (docs/profiling.md), and
    # its Chrome trace beside the report.
    step "anvil: --profile, LeNet, 8192 images on cuda:0" train.log 90 \
      "${train[@]}" --model lenet --epochs 1 --limit-train 8192 --limit-test 512 --device cuda:0 \
      --profile --profile-trace "$out/profile-lenet.json"
    step "anvil: --profile, ResNet-18, 2048 images on cuda:0" train.log 120 \
      "${train[@]}" --model resnet18 --epochs 1 --limit-train 2048 --limit-test 256 --device cuda:0 \
      --profile --profile-trace "$out/profile-resnet18.json"
  else
    skip "anvil: --gpus 1 against --device cuda:0 (LeNet, ResNet-18)" "no GPU (nvidia-smi lists none)"
  fi
fi

report
for log in tests.log bench.log train.log sanitizer.log; do
  # At most 4 MiB of each (the end), well under what a device call returns.
  [[ -f "$work/$log" ]] && tail -c 4194304 "$work/$log" >"$out/$log"
done
echo "gpu-check: $(grep -c . "$work/steps.tsv") steps in $((SECONDS - start)) s; report: $out/report.md"
sed -n '/^## Summary/,/^## /p' "$out/report.md" | sed '$d'
if grep -qP '\t(failed|timed out)' "$work/steps.tsv"; then exit 1; fi
exit 0
