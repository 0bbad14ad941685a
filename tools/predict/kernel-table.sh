#!/usr/bin/env bash
# Regenerates the kernel table in docs/kernels.md (between its
# "kernel-table" markers) from what nvcc makes of kernels/cuda/**.cu for sm_90:
# registers, spills, stack and shared memory (nvcc -Xptxas -v), occupancy on
# an H100 SM, the SASS checks (cuobjdump --dump-sass), and the FLOPs, bytes
# and roofline bounds of LeNet's and ResNet-18's layers. No GPU needed.
#
#   bash tools/predict/kernel-table.sh           # rewrite the table in docs/kernels.md
#                                          # and docs/kernel-resources.json
#   bash tools/predict/kernel-table.sh --print   # print it, change nothing
#
# Needs nvcc (CUDA 13; /usr/local/cuda/bin is searched) and cuobjdump with
# nvdisasm. This machine's CUDA has neither of the latter; they come as pip
# packages: python3 -m pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
# (found under site-packages/nvidia/cu13/bin). Exits 1 if a kernel spills,
# uses local memory, or lacks a 16-byte access its explanation claims.
set -euo pipefail
cd "$(dirname "$0")/../.."
mode=write
[[ "${1:-}" == "--print" ]] && mode=print

export PATH="$PATH:/usr/local/cuda/bin"
for site in $(python3 -c 'import site, sysconfig; print(" ".join(site.getsitepackages() + [site.getusersitepackages(), sysconfig.get_paths()["purelib"]]))' 2>/dev/null); do
  [[ -d "$site/nvidia/cu13/bin" ]] && export PATH="$PATH:$site/nvidia/cu13/bin"
done
for tool in nvcc cuobjdump nvdisasm c++filt; do
  if ! command -v "$tool" >/dev/null; then
    echo "kernel-table: $tool not found." >&2
    [[ "$tool" == cuobjdump || "$tool" == nvdisasm ]] &&
      echo "  python3 -m pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm" >&2
    exit 2
  fi
done

out=build/kernel-table
mkdir -p "$out"
rm -f "$out"/*.ptxas "$out"/*.sass "$out"/*.names "$out"/*.cubin
if grep -rl --include='*.cu' 'dynamic_shared<' kernels/cuda >/dev/null 2>&1; then
  echo "kernel-table: a kernel uses dynamic shared memory; the table counts static shared memory only" >&2
fi
# A file in a family's folder is named by its path: gemm/01_naive.cu -> gemm__01_naive.
for cu in $(find kernels/cuda -name '*.cu' | sort); do
  rel=${cu#kernels/cuda/}
  name=${rel%.cu}
  name=${name//\//__}
  # The release build's flags for one architecture (CMake: -O3 -DNDEBUG).
  nvcc -std=c++20 -O3 -DNDEBUG -arch=sm_90 -cubin -I. -Xptxas -v "$cu" -o "$out/$name.cubin" \
    2>"$out/$name.ptxas"
  cuobjdump --dump-sass "$out/$name.cubin" >"$out/$name.sass"
  grep -o 'Function : [^ ]*' "$out/$name.sass" | sed 's/Function : //' | while read -r mangled; do
    printf '%s\t%s\n' "$mangled" "$(echo "$mangled" | c++filt)"
  done >"$out/$name.names"
done

status=0
python3 tools/predict/kernel_table.py "$out" "nvcc $(nvcc --version | grep -o "release [0-9.]*, V[0-9.]*")" >"$out/table.md" || status=$?
if [[ "$mode" == print ]]; then
  cat "$out/table.md"
else
  # The launch audit (sim/launch_audit.cpp) reads the registers and shared
  # memory of each kernel from here.
  cp "$out/kernel-resources.json" docs/kernel-resources.json
  python3 - "$out/table.md" <<'EOF'
import sys
doc = "docs/kernels.md"
begin, end = "<!-- kernel-table: begin (tools/predict/kernel-table.sh) -->", "<!-- kernel-table: end -->"
text = open(doc).read()
if begin not in text or end not in text:
    sys.exit(f"kernel-table: {doc} has no '{begin}' ... '{end}' markers")
table = open(sys.argv[1]).read().strip()
head, rest = text.split(begin, 1)
_, tail = rest.split(end, 1)
open(doc, "w").write(f"{head}{begin}\n{table}\n{end}{tail}")
print(f"kernel-table: {doc} updated")
EOF
fi
exit $status
