#include "nn/module.h"

#include <algorithm>

#include "core/autograd.h"

namespace anvil::nn {

void Module::register_parameter(std::string name, Tensor* slot) {
  if (slot->defined() && !slot->requires_grad()) slot->set_requires_grad(true);
  params_.emplace_back(std::move(name), slot);
}

void Module::register_buffer(std::string name, Tensor* slot) {
  buffers_.emplace_back(std::move(name), slot);
}

void Module::register_module(std::string name, std::shared_ptr<Module> child) {
  children_.emplace_back(std::move(name), std::move(child));
}

void Module::collect(const std::string& prefix, bool params, bool buffers,
                     NamedTensors& out) const {
  if (params)
    for (auto& [name, slot] : params_)
      if (slot->defined()) out.emplace_back(prefix + name, *slot);
  if (buffers)
    for (auto& [name, slot] : buffers_)
      if (slot->defined()) out.emplace_back(prefix + name, *slot);
  for (auto& [name, child] : children_) child->collect(prefix + name + ".", params, buffers, out);
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect("", true, false, out);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect("", false, true, out);
  return out;
}

NamedTensors Module::state_dict() const {
  NamedTensors out;
  collect("", true, true, out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

std::vector<Module*> Module::modules() {
  std::vector<Module*> out{this};
  for (auto& [name, child] : children_)
    for (Module* m : child->modules())
      // A module registered under two names is listed once, as in PyTorch.
      if (std::find(out.begin(), out.end(), m) == out.end()) out.push_back(m);
  return out;
}

void Module::to(Device device) {
  NoGradGuard no_grad;
  for (auto& [name, slot] : params_) {
    if (!slot->defined() || slot->device() == device) continue;
    Tensor moved = slot->detach().to(device);
    moved.set_requires_grad(true);
    *slot = moved;
  }
  for (auto& [name, slot] : buffers_)
    if (slot->defined()) *slot = slot->to(device);
  for (auto& [name, child] : children_) child->to(device);
}

void Module::zero_grad() {
  for (auto& [name, t] : named_parameters()) t.zero_grad();
}

void Module::repr_into(std::string& out, const std::string& indent) const {
  out += describe();
  if (children_.empty()) return;
  out += "(\n";
  for (auto& [name, child] : children_) {
    out += indent + "  (" + name + "): ";
    child->repr_into(out, indent + "  ");
    out += "\n";
  }
  out += indent + ")";
}

std::string Module::repr() const {
  std::string out;
  repr_into(out, "");
  return out;
}

}  // namespace anvil::nn
