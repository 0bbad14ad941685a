// The CUDA kernels, unchanged, compiled by g++ against the simulator: one
// wrapper that includes each kernels/cuda/*.cu (CMake does not treat .cu as
// C++, and this keeps compile flags those of every other .cpp).
#include "kernels/cuda/gemm.cu"
