// label_check(n, labels, classes, batch, record): one block of 256 threads
// (labels are a batch, a few thousand at most). Each thread finds the first
// label outside [0, classes) in its strided slice, warp shuffles and a
// shared-memory step across the 8 warps take the smallest such position, and
// thread 0 writes it to the record unless the record already holds one: the
// record keeps the first bad label since the host last cleared it, without
// the host waiting for the answer.
#include <stdexcept>
#include <string>

#include "kernels/cuda/reduce/block_sum.cuh"

namespace anvil::cuda {
namespace reduce_kernels {

__global__ void __launch_bounds__(kThreads)
    label_check_kernel(int64_t n, const int64_t* __restrict__ labels, int64_t classes,
                       int64_t batch, int64_t* __restrict__ record) {
  __shared__ int64_t warp_first[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int64_t first = n;  // n: none found
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const int64_t v = labels[i];
    if ((v < 0 || v >= classes) && i < first) first = i;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const int64_t other = __shfl_xor_sync(kFullMask, first, offset);
    first = other < first ? other : first;
  }
  if (lane == 0) warp_first[warp] = first;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kWarps; ++w) first = warp_first[w] < first ? warp_first[w] : first;
    if (first < n && record[kLabelRecordIndex] < 0) {
      record[kLabelRecordIndex] = first;
      record[kLabelRecordLabel] = labels[first];
      record[kLabelRecordClasses] = classes;
      record[kLabelRecordBatch] = batch;
      record[kLabelRecordSize] = n;
    }
  }
}

}  // namespace reduce_kernels

void label_check(int64_t n, const int64_t* labels, int64_t classes, int64_t batch,
                 int64_t* record, cudaStream_t stream) {
  using namespace reduce_kernels;
  if (n < 1)
    throw std::invalid_argument("cuda::label_check: n = " + std::to_string(n) +
                                " (needs n >= 1)");
  launch(label_check_kernel, 1u, dim3(kThreads), 0, stream, n, labels, classes, batch, record);
}

}  // namespace anvil::cuda
