// ANVIL_HOST_DEVICE marks a function that both host code and, once compiled
// by nvcc, device code may call: the numerics shared by the CPU and CUDA
// kernels (core/bfloat16.h, core/tf32.h, core/pointwise.h).
#pragma once

#if defined(__CUDACC__)
#define ANVIL_HOST_DEVICE __host__ __device__
#else
#define ANVIL_HOST_DEVICE
#endif
