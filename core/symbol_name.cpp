#include "core/symbol_name.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace anvil {
namespace {

struct Symbol {
  uintptr_t start = 0;
  uint64_t size = 0;
  std::string name;
};

// The function symbols of one ELF file (.symtab, else .dynsym), by address.
std::vector<Symbol> read_function_symbols(const std::string& path) {
  std::vector<Symbol> out;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  auto read_at = [fd](void* dst, size_t bytes, uint64_t offset) {
    return pread(fd, dst, bytes, static_cast<off_t>(offset)) == static_cast<ssize_t>(bytes);
  };
  Elf64_Ehdr eh{};
  std::vector<Elf64_Shdr> sections;
  if (read_at(&eh, sizeof eh, 0) && std::memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 &&
      eh.e_ident[EI_CLASS] == ELFCLASS64 && eh.e_shentsize == sizeof(Elf64_Shdr)) {
    sections.resize(eh.e_shnum);
    if (!read_at(sections.data(), sections.size() * sizeof(Elf64_Shdr), eh.e_shoff))
      sections.clear();
  }
  for (const Elf64_Word type : {SHT_SYMTAB, SHT_DYNSYM}) {
    for (const Elf64_Shdr& sh : sections) {
      if (sh.sh_type != type || sh.sh_link >= sections.size() || sh.sh_entsize != sizeof(Elf64_Sym))
        continue;
      const Elf64_Shdr& strtab = sections[sh.sh_link];
      std::vector<Elf64_Sym> syms(sh.sh_size / sizeof(Elf64_Sym));
      std::string names(strtab.sh_size, '\0');
      if (!read_at(syms.data(), syms.size() * sizeof(Elf64_Sym), sh.sh_offset) ||
          !read_at(names.data(), names.size(), strtab.sh_offset))
        continue;
      for (const Elf64_Sym& s : syms)
        if (ELF64_ST_TYPE(s.st_info) == STT_FUNC && s.st_value != 0 && s.st_name < names.size())
          out.push_back({s.st_value, s.st_size, names.c_str() + s.st_name});
    }
    if (!out.empty()) break;
  }
  close(fd);
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.start < b.start; });
  return out;
}

}  // namespace

std::string mangled_name_at(const void* address) {
  struct Found {
    uintptr_t address;
    std::string path;
    uintptr_t base = 0;
    bool found = false;
  } f{reinterpret_cast<uintptr_t>(address), {}};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto& f = *static_cast<Found*>(data);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
          if (ph.p_type == PT_LOAD && f.address >= lo && f.address < lo + ph.p_memsz) {
            f.path = info->dlpi_name && *info->dlpi_name ? info->dlpi_name : "/proc/self/exe";
            f.base = info->dlpi_addr;
            f.found = true;
            return 1;
          }
        }
        return 0;
      },
      &f);
  if (!f.found) return {};
  static std::mutex mutex;
  static std::map<std::string, std::vector<Symbol>> objects;  // each file read once
  std::lock_guard lock(mutex);
  auto it = objects.find(f.path);
  if (it == objects.end()) it = objects.emplace(f.path, read_function_symbols(f.path)).first;
  const std::vector<Symbol>& syms = it->second;
  const uintptr_t at = f.address - f.base;
  auto next = std::upper_bound(syms.begin(), syms.end(), at,
                               [](uintptr_t a, const Symbol& s) { return a < s.start; });
  if (next == syms.begin()) return {};
  const Symbol& s = *std::prev(next);
  return at == s.start || at < s.start + s.size ? s.name : std::string();
}


std::string demangle(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> text(
      abi::__cxa_demangle(mangled, nullptr, nullptr, &status), &std::free);
  return status == 0 && text ? std::string(text.get()) : std::string(mangled);
}

std::string kernel_name_at(const void* address) {
  Dl_info info{};
  if (dladdr(address, &info) != 0 && info.dli_sname != nullptr) return demangle(info.dli_sname);
  const std::string mangled = mangled_name_at(address);
  if (!mangled.empty()) return demangle(mangled.c_str());
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
