#!/usr/bin/env bash
# Prepares the GPU run: builds the release binaries for sm_90 (H100/H200)
# and puts in .gpu/ (ignored by git) everything the GPU machine lacks, so that
# a session lent a GPU runs `bash tools/gpu/gpu-check.sh "$OUT"` there at once
# (docs/gpu.md). Run it here, from any directory:
#
#   bash tools/gpu/gpu-pack.sh
#   ANVIL_GPU_PACK=build/gpu-rehearsal/pack bash tools/gpu/gpu-pack.sh --reuse build/release
#       CI's rehearsal: packs an existing build (its own flags: not for the
#       GPU machine), uncompressed, into another folder
#
# .gpu/bundle.tar.xz  bin/: anvil-tests, anvil-parallel-tests (the NCCL
#                     tests), anvil-train, bench_cuda_kernels, bench_train,
#                     bench_allreduce, stripped (built without MPI: one GPU
#                     machine runs no multi-process job); lib/: the shared libraries they load
#                     that the GPU image lacks (OpenBLAS with gfortran and
#                     quadmath, OpenMP, fmt, zlib, the CUDA runtime, ...).
#                     libstdc++ and libgcc are linked statically; glibc, the
#                     driver and the big CUDA libraries (cuBLAS, cuDNN, NCCL)
#                     are the image's. gpu-check.sh unpacks it into
#                     .gpu/unpacked/ and removes that when it ends.
# .gpu/data/fashion-mnist/  the four gzipped IDX files
# .gpu/MANIFEST       how it was built, and every file with its size
#
# Host code is built for a portable x86-64 baseline (-march=x86-64-v3:
# AVX2 and FMA), not for this machine's CPU: the GPU machine's CPU may lack
# this one's AVX-512. The build lives in build/gpu. The folder must stay under
# the 64 MiB a device call carries (with the repository beside it): OpenBLAS
# alone is 36 MB, hence xz (bin and lib: 90 MB, 9 MB packed). The script
# fails if the folder passes 60 MiB.
set -euo pipefail
cd "$(dirname "$0")/../.."
pack=${ANVIL_GPU_PACK:-.gpu}
[[ "$pack" != / && -n "$pack" ]] || { echo "gpu-pack: ANVIL_GPU_PACK=$pack" >&2; exit 2; }
build=build/gpu
stage=build/gpu-stage
data_src=${ANVIL_FASHION_DIR:-/usr/share/datasets/fashion-mnist}
limit_mib=60  # of the 64 MiB a call carries; the repository takes the rest
reuse=""
if [[ "${1:-}" == "--reuse" ]]; then
  reuse=${2:?"--reuse needs a build folder"}
  build=$reuse
  stage=$pack
fi

export PATH="$PATH:/usr/local/cuda/bin"
if [[ -z "$reuse" ]] && ! command -v nvcc >/dev/null; then
  echo "gpu-pack: nvcc not found (CUDA 13 is expected in /usr/local/cuda)" >&2
  exit 1
fi
targets=(anvil-tests anvil-train bench_cuda_kernels bench_train)
if [[ -f bench/bench_allreduce.cpp ]]; then targets+=(bench_allreduce); fi
if [[ -f tests/parallel/CMakeLists.txt ]]; then targets+=(anvil-parallel-tests); fi
if [[ -z "$reuse" ]]; then
  bash scripts/install-deps.sh
  echo "== gpu-pack: configure $build (sm_90, -march=x86-64-v3)"
  # The tests run from the repository root there: tests/ for the golden
  # files, and anvil-train where gpu-check.sh unpacks it.
  # No MPI: one GPU machine runs no multi-process jobs, and OpenMPI's
  # runtime (plugins, help files, mpiexec) would not travel in a few files.
  # NCCL stays: the image has libnccl (nvidia-nccl-cu13).
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DANVIL_CUDA=ON -DANVIL_MPI=OFF \
    -DANVIL_CUDA_ARCHITECTURES=90 -DANVIL_NATIVE=OFF -DCMAKE_CXX_FLAGS="-march=x86-64-v3" \
    -DCMAKE_EXE_LINKER_FLAGS="-static-libstdc++ -static-libgcc" \
    -DANVIL_TEST_DATA_DIR=tests -DANVIL_TEST_TRAIN_BIN=.gpu/unpacked/bin/anvil-train >/dev/null
  echo "== gpu-pack: build ${targets[*]}"
  cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"
fi

rm -rf "$pack" "$stage"
mkdir -p "$stage/bin" "$stage/lib" "$pack/data/fashion-mnist"
for t in "${targets[@]}"; do
  exe=$(find "$build" -maxdepth 3 -type f -name "$t" -perm -u+x | head -1)
  [[ -n "$exe" ]] || { echo "gpu-pack: $t was not built in $build" >&2; exit 1; }
  strip -o "$stage/bin/$t" "$exe"
done

# Libraries every GPU image has (glibc, the GCC runtime, the driver), or that
# the image's Python packages and CUDA hold and that are too big to carry
# (cuBLAS, cuDNN, NCCL: hundreds of MB); gpu-check.sh finds the latter there.
on_image='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libresolv|libutil|libgcc_s|libstdc\+\+|libcuda|libcublas|libcublasLt|libcudnn.*|libnccl)\.so'
missing=()
for exe in "$stage"/bin/*; do
  while read -r name _ path _; do
    [[ "$name" =~ $on_image ]] && continue
    if [[ "$path" == "not" || -z "$path" ]]; then
      missing+=("$name (for $(basename "$exe"))")
      continue
    fi
    [[ -e "$stage/lib/$name" ]] || cp -L "$path" "$stage/lib/$name"
  done < <(ldd "$exe" | awk '/=>/ {print $1, $2, $3, $4}')
done
if ((${#missing[@]})); then
  echo "gpu-pack: libraries not found here: ${missing[*]}" >&2
  exit 1
fi
strip --strip-unneeded "$stage"/lib/* 2>/dev/null || true

for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte \
         t10k-labels-idx1-ubyte; do
  if [[ -f "$data_src/$f.gz" ]]; then
    cp "$data_src/$f.gz" "$pack/data/fashion-mnist/"
  elif [[ -f "$data_src/$f" ]]; then
    gzip -9 -c "$data_src/$f" >"$pack/data/fashion-mnist/$f.gz"
  else
    echo "gpu-pack: $data_src/$f(.gz) not found (ANVIL_FASHION_DIR names another folder)" >&2
    exit 1
  fi
done

# Nothing in the bundle may need more than x86-64-v3 unconditionally: an
# AVX-512 (EVEX-encoded) instruction in host code dies with SIGILL on a CPU
# without it. anvil's own AVX-512 code is chosen at run time, in functions of
# isa_ namespaces: tools/gpu/isa_check.py places every EVEX instruction of
# the unstripped binaries in its function and refuses one anywhere else.
# The libraries are judged by their bytes (evex_count): OpenBLAS (Debian's
# is built DYNAMIC_ARCH) and libgfortran (its matmul) hold AVX-512 code
# behind a check of the CPU at run time, so they are reported, not refused.
evex_count() {
  objdump -d --no-addresses "$1" 2>/dev/null | grep -cP '^\s*(?:6[67] )?62 (?:[0-9a-f]{2} ){3}.*%[xyz]mm' || true
}
isa_report=()
isa_bad=()
for t in "${targets[@]}"; do
  exe=$(find "$build" -maxdepth 3 -type f -name "$t" -perm -u+x | head -1)
  if line=$(python3 tools/gpu/isa_check.py "$exe"); then
    [[ "$line" == *"no AVX-512"* ]] || isa_report+=("$line")
  else
    isa_bad+=("${line#REFUSED }")
  fi
done
for f in "$stage"/lib/*; do
  n=$(evex_count "$f")
  ((n == 0)) && continue
  name=$(basename "$f")
  # (grep -c reads all of strings' output: -q would end the pipe early, a
  # failure under pipefail.)
  if [[ "$name" =~ ^libopenblas && $(strings "$f" | grep -c DYNAMIC_ARCH) -gt 0 ]]; then
    isa_report+=("$name: $n AVX-512 instructions, chosen at run time (DYNAMIC_ARCH)")
  elif [[ "$name" =~ ^libgfortran ]]; then
    isa_report+=("$name: $n AVX-512 instructions in matmul variants chosen at run time")
  else
    isa_bad+=("$name: $n AVX-512 instructions")
  fi
done
# A reused build is judged as the real pack would judge it when its host
# flags are the pack's (x86-64-v3: CI's release build); a -march=native
# build may hold AVX-512 anywhere, and only warns.
native=no
if [[ -n "$reuse" ]] && grep -qE '^ANVIL_NATIVE:BOOL=ON|^CMAKE_CXX_FLAGS:STRING=.*-march=(native|[^x ]|x86-64-v4)' \
    "$build/CMakeCache.txt" 2>/dev/null; then
  native=yes
fi
if ((${#isa_bad[@]})); then
  if [[ "$native" == no ]]; then
    echo "gpu-pack: host code beyond x86-64-v3 would die with SIGILL on a CPU without AVX-512: ${isa_bad[*]}" >&2
    exit 1
  fi
  isa_report+=("${isa_bad[@]/%/ (a reused -march=native build: not for the GPU machine)}")
fi

# The newest glibc symbol version the binaries need: the GPU image's glibc
# must be at least as new.
glibc=$(for f in "$stage"/bin/* "$stage"/lib/*; do objdump -T "$f" 2>/dev/null; done |
  grep -o 'GLIBC_[0-9.]*' | sort -u -V | tail -1)
{
  echo "anvil GPU bundle (tools/gpu/gpu-pack.sh)"
  [[ -n "$reuse" ]] && echo "REUSED $reuse: that build's own flags, not a bundle for the GPU machine"
  echo "commit: $(git rev-parse HEAD)$(git diff --quiet HEAD -- . || echo ' (with uncommitted changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "nvcc: $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*, V[0-9.]*'); CUDA architectures: 90"
  echo "host code: -O3 -march=x86-64-v3, libstdc++ and libgcc static, no MPI; needs glibc >= ${glibc#GLIBC_}"
  if ((${#isa_report[@]})); then
    echo "AVX-512 (EVEX) instructions: none that run unconditionally; chosen at run time:"
    printf '  %s\n' "${isa_report[@]}"
  else
    echo "AVX-512 (EVEX) instructions: none in bin/ or lib/"
  fi
  echo "from the image: glibc, libgcc_s, the driver (libcuda), cuBLAS, cuBLASLt, cuDNN (bench_cuda_kernels), NCCL where linked"
  echo "image libraries: $on_image"
  echo
  (cd "$stage" && find bin lib -type f -printf '%s\t%p\n' | sort -k2)
  (cd "$pack" && find data -type f -printf '%s\t%p\n' | sort -k2)
} >"$pack/MANIFEST.tmp"

if [[ -z "$reuse" ]]; then
  echo "== gpu-pack: xz of bin/ and lib/ ($(du -sm "$stage" | cut -f1) MiB)"
  tar -C "$stage" -cf - bin lib | xz -9 -T0 >"$pack/bundle.tar.xz"
fi
mv "$pack/MANIFEST.tmp" "$pack/MANIFEST"

size=$(du -sb "$pack" | cut -f1)
echo "== gpu-pack: $pack holds $((size / 1024 / 1024)) MiB ($size bytes)"
if [[ -z "$reuse" ]] && ((size > limit_mib * 1024 * 1024)); then
  echo "gpu-pack: $pack is over $limit_mib MiB: it would not travel with the repository" >&2
  exit 1
fi
cat "$pack/MANIFEST"
echo "== gpu-pack: done. On the GPU machine (device run, carry [\".gpu\"]):" \
  "bash tools/gpu/gpu-check.sh \"\$OUT\" --part 1, then --part 2, then (if time allows) --part 3 (docs/gpu.md)"
