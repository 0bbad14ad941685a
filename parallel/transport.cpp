// What every Transport shares: how its errors begin, its scratch memory,
// and the end of a collective done on the host.
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <string>

#include "parallel/transport.h"

namespace anvil::parallel {

std::string Transport::identity() const {
  return fmt::format("rank {} ({}, {})", rank_, name(), device_.str());
}

std::string Transport::error_prefix() const {
  return fmt::format("{}: {}: ", identity(),
                     context_.empty() ? std::string("communicator") : context_);
}

void* Transport::scratch(size_t bytes) {
  held_.push_back(Tensor::empty({int64_t(std::max<size_t>(bytes, 1))}, DType::UInt8, device_));
  return held_.back().raw_data();
}

std::unique_ptr<InFlight> Transport::end_later() {
  end();  // a transport that does the work on the host: nothing is left for later
  struct Done final : InFlight {
    void wait() override {}
  };
  return std::make_unique<Done>();
}

int64_t CallInfo::numel() const { return ndim < 0 ? 0 : shape_numel(tensor_shape()); }

}  // namespace anvil::parallel
