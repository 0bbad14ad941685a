#!/usr/bin/env bash
# The launch audit of one training step (docs/kernels.md, "Launch audit"):
# runs build/sim/train_step (the simulator build) for MODEL at BATCH with
# ANVIL_SIM_LAUNCH_AUDIT, then prints the Markdown table of its kernels,
# sorted by their share of the step's simulated work, with the predicted SM
# utilisation on an H100 of each; rows with >= 1% of the work and a
# utilisation below 0.8 are in bold.
#
#   bash tools/predict/launch-audit.sh lenet 256                 # print the table
#   bash tools/predict/launch-audit.sh resnet18 128 --sample 8   # at most 8 blocks per launch run
#   bash tools/predict/launch-audit.sh lenet 256 --write         # also rewrite its table in docs/generated/launch-audit.md
#
# --sample N sets ANVIL_SIM_SAMPLE_BLOCKS=N: each launch runs N evenly spread
# blocks and skips the rest (a full ResNet-18 step takes too long on the
# simulator); the timings stay usable, the step's numbers do not. --recipe R
# (default seed) picks the optimizer, as anvil-train's --recipe.
# --fp32-precision P (default ieee: the FP32 kernels that docs/generated/'s
# audits and tools/predict/step_time.py model) picks the float32 math, as
# anvil-train's (docs/precision.md; tf32: the tensor-core rungs). --runs N
# (default 5) runs the step N times and reports each kernel's median: one
# run's block times carry whatever the host took from this virtual machine
# (tools/predict/launch_audit.py). The build
# folder is build/sim unless ANVIL_BUILD says otherwise; train_step is
# (re)built there first. The runs' audit files stay in build/launch-audit/
# (MODEL-BATCH-runK.jsonl), with their merge in MODEL-BATCH.jsonl, which
# tools/predict/step_time.py reads; other precisions than ieee add theirs to
# the names (MODEL-BATCH-tf32.jsonl). --amp bf16 runs the step under bfloat16
# autocast (docs/mixed-precision.md), as anvil-train's --amp; its files are
# tagged -bf16 (MODEL-BATCH-bf16.jsonl) and --write puts its table in
# docs/generated/launch-audit-bf16.md. The convolutions' rung is set for the
# run, whatever the backend ships (kernels/cuda/conv/conv.h): the BF16 ones
# on ANVIL_CONV_BF16_RUNG (7 when unset, the names above; 8, the shipped
# rung, tags the bf16 files -bf16-rung8 and --write puts the table in
# docs/generated/launch-audit-bf16-rung8.md), the TF32 ones on
# ANVIL_CONV_TF32_RUNG (6 when unset; 9, the shipped rung, tags the tf32
# files -tf32-rung9, docs/generated/launch-audit-tf32-rung9.md).
# ANVIL_NO_BUILD=1 runs the train_step
# already in the build folder without (re)building it (another checkout's
# build, say).
set -euo pipefail
cd "$(dirname "$0")/../.."
usage="usage: tools/predict/launch-audit.sh MODEL BATCH [--sample N] [--runs N] [--recipe R] [--fp32-precision P] [--amp bf16] [--write]"
[[ $# -ge 2 ]] || { echo "$usage" >&2; exit 2; }
model=$1 batch=$2
shift 2
sample=0 runs=5 recipe=seed precision=ieee amp=off write=
while [[ $# -gt 0 ]]; do
  case $1 in
    --sample) sample=${2:?--sample needs a block count}; shift 2 ;;
    --runs) runs=${2:?--runs needs a count}; shift 2 ;;
    --recipe) recipe=${2:?--recipe needs seed or best}; shift 2 ;;
    --fp32-precision) precision=${2:?--fp32-precision needs default, ieee or tf32}; shift 2 ;;
    --amp) amp=${2:?--amp needs off or bf16}; shift 2 ;;
    --write) write=1; shift ;;
    *) echo "launch-audit: unknown argument '$1'" >&2; echo "$usage" >&2; exit 2 ;;
  esac
done
[[ $amp == off || $amp == bf16 ]] || { echo "launch-audit: --amp '$amp' is not off or bf16" >&2; exit 2; }
rung=${ANVIL_CONV_BF16_RUNG:-7}
[[ $rung == 7 || $rung == 8 ]] || { echo "launch-audit: ANVIL_CONV_BF16_RUNG '$rung' is not 7 or 8" >&2; exit 2; }
tf32_rung=${ANVIL_CONV_TF32_RUNG:-6}
[[ $tf32_rung == 6 || $tf32_rung == 9 ]] || { echo "launch-audit: ANVIL_CONV_TF32_RUNG '$tf32_rung' is not 6 or 9" >&2; exit 2; }
rung9=
[[ $precision == tf32 && $amp == off && $tf32_rung == 9 ]] && rung9=1
[[ $batch =~ ^[1-9][0-9]*$ ]] || { echo "launch-audit: BATCH '$batch' is not a positive number" >&2; exit 2; }
[[ $sample =~ ^[0-9]+$ ]] || { echo "launch-audit: --sample '$sample' is not a block count" >&2; exit 2; }
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "launch-audit: --runs '$runs' is not a positive count" >&2; exit 2; }

build=${ANVIL_BUILD:-build/sim}
if ! grep -q 'ANVIL_CUDA:STRING=SIM' "$build/CMakeCache.txt" 2>/dev/null; then
  echo "launch-audit: $build is not a simulator build (cmake --preset sim)" >&2
  exit 2
fi
[[ ${ANVIL_NO_BUILD:-} == 1 ]] || nice -n 19 cmake --build "$build" --target train_step -j2 >/dev/null

out=build/launch-audit
mkdir -p "$out"
tag=""  # the FP32 audits keep the names tools/predict/step_time.py reads
[[ $precision != ieee ]] && tag="-$precision"
[[ $amp != off ]] && tag+="-$amp"
[[ $amp != off && $rung == 8 ]] && tag+="-rung8"  # conv rung 08 (ANVIL_CONV_BF16_RUNG=8)
[[ -n $rung9 ]] && tag+="-rung9"  # conv rung 09 (ANVIL_CONV_TF32_RUNG=9)
audits=()
start=$(date +%s)
for ((run = 1; run <= runs; ++run)); do
  audit="$out/$model-$batch$tag-run$run.jsonl"
  ANVIL_SIM_LAUNCH_AUDIT="$audit" ANVIL_SIM_SAMPLE_BLOCKS="$sample" \
    ANVIL_CONV_BF16_RUNG="$rung" ANVIL_CONV_TF32_RUNG="$tf32_rung" \
    nice -n 19 "$build/train_step" --model "$model" --batch-size "$batch" --recipe "$recipe" \
      --fp32-precision "$precision" --amp "$amp" >&2
  audits+=("$audit")
done
seconds=$(( ($(date +%s) - start) / runs ))

cmd="tools/predict/launch-audit.sh $model $batch"
[[ $amp != off && $rung == 8 ]] && cmd="ANVIL_CONV_BF16_RUNG=8 $cmd"
[[ -n $rung9 ]] && cmd="ANVIL_CONV_TF32_RUNG=9 $cmd"
[[ $sample != 0 ]] && cmd+=" --sample $sample"
[[ $recipe != seed ]] && cmd+=" --recipe $recipe"
[[ $precision != ieee ]] && cmd+=" --fp32-precision $precision"
[[ $amp != off ]] && cmd+=" --amp $amp"
[[ $runs != 5 ]] && cmd+=" --runs $runs"
what="fp32 precision $precision"
[[ $amp != off ]] && what+=", amp $amp"
[[ $amp != off && $rung == 8 ]] && what+=", conv rung 08"
[[ -n $rung9 ]] && what+=", conv rung 09"
title="**$model, batch $batch, one training step ($recipe recipe, $what)**, \`$cmd\` ($(date -u +%Y-%m-%d), ${seconds} s a run on this machine)"
args=("${audits[@]}" --title "$title" --save "$out/$model-$batch$tag.jsonl")
[[ -n $write ]] && args+=(--write "$model $batch")
[[ -n $write && -n $tag ]] && args+=(--doc "docs/generated/launch-audit$tag.md")
python3 tools/predict/launch_audit.py "${args[@]}"
