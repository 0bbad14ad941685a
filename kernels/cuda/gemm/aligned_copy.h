// The aligned copies of the multistage GEMM rungs 11 (float32 operands) and
// 12 (bfloat16 ones): their kernels copy operands into shared memory by
// 16-byte cp.async only, so an operand whose base or row stride is not a
// multiple of 16 bytes (LeNet's and ResNet-18's 10-wide classifier: the
// loss gradient dY is N x 10, rows 40 bytes apart in float32, 20 in
// bfloat16) is first copied, by one copy_rows launch (elementwise.cu), into
// the workspace with each row rounded up to whole 16-byte chunks. The
// copy's padding is never read: the kernels mask their copies by M, N and
// K, not by the row stride (mma_ldmatrix.cuh's GemmIterator), so it is
// left as the workspace holds it. The same values in the same places of
// op(A) and op(B), so the same products summed in the same order: the
// results are the bits the rung gives on an aligned operand, which are
// rungs 09's and 10's (tests/test_cuda_gemm_mma.cpp).
//
// The workspace: the rung's split-K partials (gemm_workspace_floats of the
// shape), then A's copy, then B's, each from a 16-byte boundary; sized by
// gemm_workspace_floats of the operands (gemm.h), the backend's size.
// Host code; gemm.cpp sizes with it, the rungs' launchers copy with it.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/gemm/gemm.h"

namespace anvil::cuda::aligned_copy {

constexpr int64_t kChunkBytes = 16;  // one cp.async copy

// One operand as stored: `rows` rows of `row` elements, `ld` apart from base.
template <class T>
struct Stored {
  const T* base;
  int64_t rows, row, ld;
};
// A stored M x K (K x M when transposed) and B stored K x N (N x K).
template <class T>
Stored<T> stored_a(bool trans_a, int64_t M, int64_t K, const T* A, int64_t lda) {
  return {A, trans_a ? K : M, trans_a ? M : K, lda};
}
template <class T>
Stored<T> stored_b(bool trans_b, int64_t N, int64_t K, const T* B, int64_t ldb) {
  return {B, trans_b ? N : K, trans_b ? K : N, ldb};
}

// Whether every 16-byte chunk of rows `ld` apart from base is aligned.
template <class T>
bool aligned(const T* base, int64_t ld) {
  return reinterpret_cast<uintptr_t>(base) % kChunkBytes == 0 &&
         ld * int64_t(sizeof(T)) % kChunkBytes == 0;
}
// An operand with no element is never read: it needs no copy.
template <class T>
bool needs_copy(const Stored<T>& s) {
  return s.rows > 0 && s.row > 0 && !aligned(s.base, s.ld);
}
// The copy's row stride: the row rounded up to whole chunks.
template <class T>
int64_t padded_ld(int64_t row) {
  constexpr int64_t per_chunk = kChunkBytes / int64_t(sizeof(T));
  return (row + per_chunk - 1) / per_chunk * per_chunk;
}
// Floats of the copy, whole chunks (so the next copy starts aligned); 0
// where the operand needs none.
template <class T>
int64_t copy_floats(const Stored<T>& s) {
  if (!needs_copy(s)) return 0;
  const int64_t chunks = (s.rows * padded_ld<T>(s.row) * int64_t(sizeof(T)) + kChunkBytes - 1) /
                         kChunkBytes;
  return chunks * kChunkBytes / int64_t(sizeof(float));
}
// The floats past the partials: the copies, plus 3 to reach a 16-byte
// boundary from any float.
template <class T>
int64_t workspace_floats(const Stored<T>& a, const Stored<T>& b) {
  const int64_t copies = copy_floats(a) + copy_floats(b);
  return copies == 0 ? 0 : copies + int64_t(kChunkBytes / sizeof(float)) - 1;
}

// g with each operand that needs it replaced by its aligned copy, queued on
// `stream` into g.workspace past its first `partials` floats (the split-K
// partials of the rung that reads the copies).
template <class T, class TC>
GemmArgsOf<T, TC> operands(const GemmArgsOf<T, TC>& g, size_t partials, cudaStream_t stream) {
  GemmArgsOf<T, TC> out = g;
  const Stored<T> a = stored_a(g.trans_a, g.M, g.K, g.A, g.lda);
  const Stored<T> b = stored_b(g.trans_b, g.N, g.K, g.B, g.ldb);
  if (!needs_copy(a) && !needs_copy(b)) return out;
  const uintptr_t room = reinterpret_cast<uintptr_t>(g.workspace + partials);
  float* next = reinterpret_cast<float*>((room + kChunkBytes - 1) / kChunkBytes * kChunkBytes);
  const auto copy = [&](const Stored<T>& s, const T*& base, int64_t& ld) {
    if (!needs_copy(s)) return;
    T* to = reinterpret_cast<T*>(next);
    copy_rows(s.rows, s.row, sizeof(T), s.base, s.ld, to, padded_ld<T>(s.row), stream);
    base = to;
    ld = padded_ld<T>(s.row);
    next += copy_floats(s);
  };
  copy(a, out.A, out.lda);
  copy(b, out.B, out.ldb);
  return out;
}

}  // namespace anvil::cuda::aligned_copy
