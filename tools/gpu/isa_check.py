#!/usr/bin/env python3
"""Host code beyond x86-64-v3 in a binary: run-time dispatched, or not.

The GPU machine's CPU may lack AVX-512, so an AVX-512 (EVEX-encoded)
instruction that runs unconditionally dies there with SIGILL. anvil compiles
host code for x86-64-v3 and keeps its AVX-512 code in functions built with a
target attribute, called only after a check of the CPU at run time
(kernels/cpu/gemm_bf16.cpp: cpu_has_bf16_dot()). Such functions live in a
namespace whose name starts with `isa_` (anvil::cpu::isa_avx512bf16): that
name is the contract this check reads. Every EVEX instruction is attributed
to the function it lies in (objdump -d of the unstripped binary, symbols
demangled); one in a function outside an `isa_` namespace is unconditional
and refused.

  isa_check.py BINARY...      one line per binary; exit 1 if any is refused
  isa_check.py --self-test    compiles two small programs with g++ and checks
                              that the one with AVX-512 outside an isa_
                              namespace is refused and the other accepted

A binary without symbols (stripped) cannot be judged: refused.
"""
import os
import re
import subprocess
import sys
import tempfile

# EVEX starts with 0x62 in 64-bit code (after optional 66/67 prefixes); a
# vector register on the line tells it from BOUND, invalid in 64-bit code.
EVEX = re.compile(r"^\s*[0-9a-f]+:\s+(?:6[67] )?62 (?:[0-9a-f]{2} ){3}.*%[xyz]mm")
FUNCTION = re.compile(r"^[0-9a-f]+ <(.*)>:$")
DISPATCHED = re.compile(r"(?:^|::|\s)isa_[A-Za-z0-9_]*::")


def evex_by_function(path):
    """{function: EVEX instruction count} of one binary, and whether it had symbols."""
    proc = subprocess.run(["objdump", "-d", "-C", path], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"isa_check: objdump -d {path} failed: {proc.stderr.strip()}")
    counts, function, named = {}, "?", False
    for line in proc.stdout.splitlines():
        m = FUNCTION.match(line)
        if m:
            function = m.group(1)
            named = named or not function.startswith(".")
            continue
        if EVEX.match(line):
            counts[function] = counts.get(function, 0) + 1
    return counts, named


def judge(path):
    """(ok, line): the binary's verdict and a line saying why."""
    counts, named = evex_by_function(path)
    name = os.path.basename(path)
    if not counts:
        return True, f"{name}: no AVX-512 instructions"
    if not named:
        return False, f"{name}: {sum(counts.values())} AVX-512 instructions and no symbols to place them"
    dispatched = {f: n for f, n in counts.items() if DISPATCHED.search(f)}
    bad = {f: n for f, n in counts.items() if f not in dispatched}
    if bad:
        worst = sorted(bad.items(), key=lambda kv: -kv[1])[:5]
        where = "; ".join(f"{n} in {f}" for f, n in worst)
        return False, (f"{name}: {sum(bad.values())} AVX-512 instructions outside an isa_ "
                       f"namespace (unconditional): {where}")
    return True, (f"{name}: {sum(dispatched.values())} AVX-512 instructions, all in "
                  f"{len(dispatched)} functions chosen at run time (isa_ namespaces)")


SELF_TEST = r"""
#include <immintrin.h>
#include <cstdio>
namespace demo::%s {
__attribute__((target("avx512f"), noinline)) float sum16(const float* p) {
  return _mm512_reduce_add_ps(_mm512_loadu_ps(p));
}
}
int main() {
  float v[16] = {};
  if (__builtin_cpu_supports("avx512f")) std::printf("%%f\n", demo::%s::sum16(v));
}
"""


def self_test():
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for namespace, want in (("isa_avx512", True), ("plain", False)):
            src, exe = os.path.join(tmp, f"{namespace}.cpp"), os.path.join(tmp, namespace)
            with open(src, "w") as f:
                f.write(SELF_TEST % (namespace, namespace))
            subprocess.run(["g++", "-O2", "-march=x86-64-v3", src, "-o", exe], check=True)
            ok, line = judge(exe)
            verdict = "accepted" if ok else "refused"
            print(f"{'ok ' if ok == want else 'FAIL'} {namespace}: {verdict}: {line}")
            failures += ok != want
            if namespace == "isa_avx512":  # stripped, it cannot be judged
                subprocess.run(["strip", exe], check=True)
                ok, line = judge(exe)
                print(f"{'ok ' if not ok else 'FAIL'} stripped: {line}")
                failures += ok
    print(f"{3 - failures} passed, {failures} failed")
    return 1 if failures else 0


def main(argv):
    if argv == ["--self-test"]:
        return self_test()
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    status = 0
    for path in argv:
        ok, line = judge(path)
        print(line if ok else f"REFUSED {line}")
        status |= 0 if ok else 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
