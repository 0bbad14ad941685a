# Sourced by .ci/run and scripts/test.sh. `stage NAME COMMAND...` runs one
# stage and prints its time; `stage_report [BUDGET_MIN]` prints every stage's
# time and the total (against the budget, when given). A script run by
# another that sources this too adds its stages to the caller's table
# (ANVIL_STAGE_LOG). Nothing fails on time: the machines are noisy; a stage
# that grows shows in the table of its own run.
if [[ -z "${ANVIL_STAGE_LOG:-}" ]]; then
  ANVIL_STAGE_LOG=$(mktemp)
  export ANVIL_STAGE_LOG
  _stage_owner=1
else
  _stage_owner=0
fi
_stage_start=${SECONDS}

stage() {
  local name=$1
  shift
  echo "== ${name}"
  local t0=${SECONDS}
  "$@"
  local dt=$((SECONDS - t0))
  printf '%s\t%d\n' "${name}" "${dt}" >>"${ANVIL_STAGE_LOG}"
  printf '== %s: %d min %02d s\n' "${name}" $((dt / 60)) $((dt % 60))
}

# Only the script that started the table prints it (and removes its file).
stage_report() {
  ((_stage_owner)) || return 0
  local budget_min=${1:-} total=$((SECONDS - _stage_start)) name secs
  echo "== stage times"
  while IFS=$'\t' read -r name secs; do
    printf '   %-52s %5d s\n' "${name}" "${secs}"
  done <"${ANVIL_STAGE_LOG}"
  rm -f "${ANVIL_STAGE_LOG}"
  if [[ -n "${budget_min}" ]]; then
    printf '   %-52s %5d s = %d min %02d s, of a %d-minute budget\n' total "${total}" \
      $((total / 60)) $((total % 60)) "${budget_min}"
    ((total <= budget_min * 60)) ||
      echo "== over the ${budget_min}-minute budget (CI's hard limit is 90 minutes): find the stage that grew"
  else
    printf '   %-52s %5d s = %d min %02d s\n' total "${total}" $((total / 60)) $((total % 60))
  fi
}
