// The simulated NCCL's collectives: what moves once every rank's part of one
// has reached the head of its stream (sim/nccl_sim.cpp decides when). Each
// result is put together on the host first, from every rank's send buffer,
// and only then written to the receive buffers, so in-place calls (NCCL's
// rule: all-gather's sendbuff at recvbuff + rank * sendcount, reduce-scatter's
// recvbuff at sendbuff + rank * recvcount, broadcast's sendbuff == recvbuff)
// read nothing that has already been overwritten. Reductions add in rank
// order, so a result is the same on every rank and from run to run.
// bfloat16 is added as NCCL's ring adds it: each rank's part is widened to
// float and added to the running sum, which is rounded to bfloat16 after
// every addition (in NCCL it goes on to the next GPU in bfloat16); ncclAvg
// divides the final sum in float and rounds once more.
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/bfloat16.h"
#include "sim/nccl_sim_ops.h"

namespace anvil_sim_nccl::detail {

size_t dtype_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
  }
  return 0;
}

const char* op_name(Op::Kind k) {
  switch (k) {
    case Op::kSend: return "ncclSend";
    case Op::kRecv: return "ncclRecv";
    case Op::kAllReduce: return "ncclAllReduce";
    case Op::kBroadcast: return "ncclBroadcast";
    case Op::kAllGather: return "ncclAllGather";
    case Op::kReduceScatter: return "ncclReduceScatter";
  }
  return "?";
}

size_t Op::src_bytes() const {
  const size_t b = count * dtype_bytes(dtype);
  switch (kind) {
    case kRecv: return 0;
    case kBroadcast: return comm->rank == root ? b : 0;
    case kReduceScatter: return b * size_t(comm->nranks);
    default: return b;
  }
}

size_t Op::dst_bytes() const {
  const size_t b = count * dtype_bytes(dtype);
  switch (kind) {
    case kSend: return 0;
    case kAllGather: return b * size_t(comm->nranks);
    default: return b;
  }
}

namespace {

template <typename T>
void sum_into(std::vector<unsigned char>& acc, const void* src, size_t count, bool first) {
  T* a = reinterpret_cast<T*>(acc.data());
  const T* s = static_cast<const T*>(src);
  for (size_t i = 0; i < count; ++i) a[i] = first ? s[i] : T(a[i] + s[i]);
}
void sum_into_bf16(std::vector<unsigned char>& acc, const void* src, size_t count, bool first) {
  auto* a = reinterpret_cast<anvil::bfloat16*>(acc.data());
  const auto* s = static_cast<const anvil::bfloat16*>(src);
  for (size_t i = 0; i < count; ++i)
    a[i] = first ? s[i] : anvil::bfloat16(a[i].to_float() + s[i].to_float());
}
void divide_bf16(std::vector<unsigned char>& acc, size_t count, int n) {
  auto* a = reinterpret_cast<anvil::bfloat16*>(acc.data());
  for (size_t i = 0; i < count; ++i) a[i] = anvil::bfloat16(a[i].to_float() / float(n));
}
template <typename T>
void divide(std::vector<unsigned char>& acc, size_t count, int n) {
  T* a = reinterpret_cast<T*>(acc.data());
  for (size_t i = 0; i < count; ++i) a[i] = T(a[i] / T(n));
}

// "rank 0 asked for ncclAllGather #3 of 10 elements of type 7"
std::string describe(const Op& op) {
  std::string s = "rank " + std::to_string(op.comm->rank) + " asked for " + op_name(op.kind) +
                  " #" + std::to_string(op.number) + " of " + std::to_string(op.count) +
                  " elements of type " + std::to_string(int(op.dtype));
  if (op.kind == Op::kAllReduce || op.kind == Op::kReduceScatter)
    s += " (op " + std::to_string(int(op.redop)) + ")";
  if (op.kind == Op::kBroadcast) s += " from rank " + std::to_string(op.root);
  return s;
}

bool same_call(const Op& a, const Op& b) {
  if (a.kind != b.kind || a.count != b.count || a.dtype != b.dtype) return false;
  if ((a.kind == Op::kAllReduce || a.kind == Op::kReduceScatter) && a.redop != b.redop)
    return false;
  return a.kind != Op::kBroadcast || a.root == b.root;
}

// The elementwise sum (or mean) over the ranks of `count` elements each.
std::vector<unsigned char> reduce(const std::vector<OpPtr>& ops, size_t count) {
  const Op& first = *ops.front();
  const char* name = op_name(first.kind);
  if (first.redop != ncclSum && first.redop != ncclAvg)
    throw std::runtime_error(std::string("simulated NCCL: ") + name +
                             " supports ncclSum and ncclAvg only");
  std::vector<unsigned char> acc(count * dtype_bytes(first.dtype));
  for (size_t r = 0; r < ops.size(); ++r) {
    const bool head = r == 0;
    switch (first.dtype) {
      case ncclFloat32: sum_into<float>(acc, ops[r]->src, count, head); break;
      case ncclFloat64: sum_into<double>(acc, ops[r]->src, count, head); break;
      case ncclInt32: sum_into<int32_t>(acc, ops[r]->src, count, head); break;
      case ncclInt64: sum_into<int64_t>(acc, ops[r]->src, count, head); break;
      case ncclBfloat16: sum_into_bf16(acc, ops[r]->src, count, head); break;
      default:
        throw std::runtime_error(std::string("simulated NCCL: ") + name +
                                 ": unsupported data type");
    }
  }
  if (first.redop == ncclAvg) {
    const int n = int(ops.size());
    switch (first.dtype) {
      case ncclFloat32: divide<float>(acc, count, n); break;
      case ncclFloat64: divide<double>(acc, count, n); break;
      case ncclInt32: divide<int32_t>(acc, count, n); break;
      case ncclInt64: divide<int64_t>(acc, count, n); break;
      case ncclBfloat16: divide_bf16(acc, count, n); break;
      default: break;
    }
  }
  return acc;
}

}  // namespace

void run_collective(const std::vector<OpPtr>& ops) {
  const Op& first = *ops.front();
  for (const OpPtr& op : ops)
    if (!same_call(first, *op))
      throw std::runtime_error("simulated NCCL: collective #" + std::to_string(first.number) +
                               ": " + describe(first) + ", " + describe(*op));
  const size_t n = ops.size();
  const size_t block = first.count * dtype_bytes(first.dtype);  // one rank's part
  switch (first.kind) {
    case Op::kAllReduce: {
      const std::vector<unsigned char> acc = reduce(ops, first.count);
      for (const OpPtr& op : ops)
        if (!acc.empty()) std::memcpy(op->dst, acc.data(), acc.size());
      return;
    }
    case Op::kReduceScatter: {
      // Rank r's block r of the reduced n * count elements.
      const std::vector<unsigned char> acc = reduce(ops, first.count * n);
      for (size_t r = 0; r < n; ++r)
        if (block) std::memcpy(ops[r]->dst, acc.data() + r * block, block);
      return;
    }
    case Op::kBroadcast: {
      const Op& root = *ops[size_t(first.root)];
      const std::vector<unsigned char> data(static_cast<const unsigned char*>(root.src),
                                            static_cast<const unsigned char*>(root.src) + block);
      for (const OpPtr& op : ops)
        if (block) std::memcpy(op->dst, data.data(), block);
      return;
    }
    case Op::kAllGather: {
      // Rank r's sendbuff at block r of every rank's recvbuff.
      std::vector<unsigned char> all(block * n);
      for (size_t r = 0; r < n; ++r)
        if (block) std::memcpy(all.data() + r * block, ops[r]->src, block);
      for (const OpPtr& op : ops)
        if (!all.empty()) std::memcpy(op->dst, all.data(), all.size());
      return;
    }
    case Op::kSend:
    case Op::kRecv: break;
  }
  throw std::logic_error("simulated NCCL: run_collective of a send or receive");
}

}  // namespace anvil_sim_nccl::detail
