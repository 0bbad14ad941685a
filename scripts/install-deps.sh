#!/usr/bin/env bash
# Installs the Debian packages anvil builds against (and the Fashion-MNIST
# data set) when any is missing. As root it runs apt-get; otherwise it prints
# the exact command to run and stops.
#   scripts/install-deps.sh          build + test + train dependencies
#   scripts/install-deps.sh --torch  also python3-torch (benchmarks' peer, golden values)
#   scripts/install-deps.sh --fuzz   also clang with libFuzzer (scripts/fuzz.sh, the fuzz preset)
#   scripts/install-deps.sh --plot   also python3-matplotlib (scripts/plot-metrics.py)
#   scripts/install-deps.sh --ccache also ccache (the build compiles through it when present)
# Options combine: .ci/run gives --plot --ccache.
set -euo pipefail

packages=(g++ cmake make pkg-config catch2 libopenblas-openmp-dev libcli11-dev libfmt-dev
          nlohmann-json3-dev zlib1g-dev libboost-context-dev libopenmpi-dev openmpi-bin
          dataset-fashion-mnist)
for option in "$@"; do
  case "${option}" in
    --torch) packages+=(python3-torch) ;;
    --fuzz) packages+=(clang libclang-rt-dev libomp-dev) ;;
    --plot) packages+=(python3-matplotlib) ;;
    --ccache) packages+=(ccache) ;;
    *) echo "install-deps.sh: unknown option '${option}' (known: --torch, --fuzz, --plot, --ccache)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "anvil: installing missing packages: ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then
  echo "anvil: not root; run this, then try again:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "anvil: packages installed"
