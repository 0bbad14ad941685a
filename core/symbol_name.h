// Names of functions from their addresses: the one demangler, used to name
// kernels by the launch errors (kernels/cuda/launch.cpp), the simulator's
// errors and launch audit (sim/), and the profiler's slices.
#pragma once
#include <string>
#include <string_view>

namespace anvil {

// The demangled form of a mangled C++ symbol, or the symbol itself when it
// does not demangle.
std::string demangle(const char* mangled);

// The mangled name of the function at `address`, from the symbol table of
// the file it was loaded from (.symtab, else .dynsym; each file read once),
// or "" when no symbol covers it (a stripped binary).
std::string mangled_name_at(const void* address);

// "namespace::kernel(argument types)" for the function at `address`, from
// the dynamic symbol table, else the file's own, or "kernel at 0x..." where
// no symbol covers it (a stripped binary).
std::string kernel_name_at(const void* address);

// The short form of a demangled kernel name: "conv_kernels::forward_warp_tiled<...>"
// for "void anvil::cuda::conv_kernels::forward_warp_tiled<...>(...)": the
// template arguments name the rung's tile, the parameters add nothing.
std::string short_kernel_name(std::string_view demangled);

}  // namespace anvil
