#include "core/symbol_name.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <memory>

namespace anvil {

std::string demangle(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> text(
      abi::__cxa_demangle(mangled, nullptr, nullptr, &status), &std::free);
  return status == 0 && text ? std::string(text.get()) : std::string(mangled);
}

std::string kernel_name_at(const void* address) {
  Dl_info info{};
  if (dladdr(address, &info) != 0 && info.dli_sname != nullptr) return demangle(info.dli_sname);
  return fmt::format("kernel at {}", address);
}

std::string short_kernel_name(std::string_view demangled) {
  std::string name(demangled);
  if (!name.empty() && name.back() == ')') {  // cut the parameter list
    int depth = 0;
    for (size_t i = name.size(); i-- > 0;) {
      depth += name[i] == ')' ? 1 : name[i] == '(' ? -1 : 0;
      if (depth == 0) {
        name.resize(i);
        break;
      }
    }
  }
  if (name.starts_with("void ")) name.erase(0, 5);
  for (size_t at; (at = name.find("anvil::cuda::")) != std::string::npos;) name.erase(at, 13);
  return name;
}

}  // namespace anvil
