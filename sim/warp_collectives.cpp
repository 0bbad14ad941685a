// The warp collectives of a simulated block: shuffles, votes, __syncwarp,
// __activemask, mma.sync and ldmatrix.sync. A lane that reaches one yields
// to the scheduler (scheduler.cpp) with its operands in its SimThread; when
// every live lane of the block waits somewhere, resolve_warps() completes
// each collective whose lanes have all arrived, or names the lane that can
// never complete its own. Compiled without TSan instrumentation, as
// scheduler.cpp is: the copies into and out of the fibers' stacks are the
// hardware's, not accesses of the host thread.
#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <string>

#include "sim/mma_sim.h"
#include "sim/sim_thread.h"

namespace anvil::sim::detail {

const char* op_name(WarpOp op) {
  switch (op) {
    case WarpOp::kShfl: return "__shfl_sync";
    case WarpOp::kShflUp: return "__shfl_up_sync";
    case WarpOp::kShflDown: return "__shfl_down_sync";
    case WarpOp::kShflXor: return "__shfl_xor_sync";
    case WarpOp::kBallot: return "__ballot_sync";
    case WarpOp::kAny: return "__any_sync";
    case WarpOp::kAll: return "__all_sync";
    case WarpOp::kSync: return "__syncwarp";
    case WarpOp::kActive: return "__activemask";
    case WarpOp::kMma: return "mma.sync";
    case WarpOp::kLdmatrix: return "ldmatrix.sync";
  }
  return "?";
}

namespace {

std::string hex(unsigned v) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", v);
  return text;
}

bool is_shuffle(WarpOp op) {
  return op == WarpOp::kShfl || op == WarpOp::kShflUp || op == WarpOp::kShflDown ||
         op == WarpOp::kShflXor;
}

// The lane a shuffle reads, as the hardware's shfl.sync computes it: lanes
// form segments of `width`; up and down never leave the lane's segment, xor
// may reach earlier segments but not later ones, idx wraps within the
// segment. Out of range, the lane reads its own value.
unsigned shuffle_source(WarpOp op, unsigned lane, int arg, int width) {
  const int seg = width - 1;
  const int min_lane = static_cast<int>(lane) & ~seg;
  const int max_lane = min_lane | seg;
  const int self = static_cast<int>(lane);
  int j = self;
  switch (op) {
    case WarpOp::kShflUp: j = self - arg, j = j >= min_lane ? j : self; break;
    case WarpOp::kShflDown: j = self + arg, j = j <= max_lane ? j : self; break;
    case WarpOp::kShflXor: j = self ^ (arg & 31), j = j <= max_lane ? j : self; break;
    default: j = min_lane | (arg & seg); break;
  }
  return static_cast<unsigned>(j);
}

// All-ones: a shuffle from a lane that takes no part (NaN as a float).
constexpr uint64_t kPoison = ~uint64_t{0};

const mma::LaneOperands& mma_operands(const SimThread& t) {
  return *reinterpret_cast<const mma::LaneOperands*>(static_cast<uintptr_t>(t.value));
}

const mma::LdmatrixLane& ldmatrix_operands(const SimThread& t) {
  return *reinterpret_cast<const mma::LdmatrixLane*>(static_cast<uintptr_t>(t.value));
}

// mma.sync and ldmatrix.sync: collectives of the whole warp at one call
// site, in one variant (t.arg: the shape, or N and .trans).
bool is_matrix_op(WarpOp op) { return op == WarpOp::kMma || op == WarpOp::kLdmatrix; }

std::string variant_name(const SimThread& t) {
  if (t.op == WarpOp::kMma) return mma::shape_name(mma_operands(t).shape);
  const mma::LdmatrixLane& ops = ldmatrix_operands(t);
  return mma::ldmatrix_name(ops.count, ops.trans);
}

const std::source_location& call_site(const SimThread& t) {
  return t.op == WarpOp::kMma ? mma_operands(t).where : ldmatrix_operands(t).where;
}

std::string site_text(const std::source_location& where) {
  return std::string(where.file_name()) + ":" + std::to_string(where.line());
}

// The file names of one translation unit's sites are one string literal:
// equal pointers spare the comparison (ran per lane of every mma.sync).
bool same_site(const std::source_location& x, const std::source_location& y) {
  return x.line() == y.line() && x.column() == y.column() &&
         (x.file_name() == y.file_name() || std::strcmp(x.file_name(), y.file_name()) == 0);
}

// An mma.sync of the whole warp: every lane's registers are read, D is
// computed, and every lane's D written, before any lane runs on (a lane's D
// may be its C). This file is not instrumented by TSan, so the copies in and
// out are not seen as accesses of the host thread to the fibers' stacks.
void complete_mma(SimThread* lanes) {
  const mma::Shape shape = mma_operands(lanes[0]).shape;
  mma::WarpRegisters in;
  for (unsigned lane = 0; lane < 32; ++lane) {
    const mma::LaneOperands& ops = mma_operands(lanes[lane]);
    std::memcpy(in.a[lane], ops.a, sizeof in.a[lane]);
    std::memcpy(in.b[lane], ops.b, sizeof in.b[lane]);
    std::memcpy(in.c[lane], ops.c, sizeof in.c[lane]);
  }
  float d[32][4];
  mma::compute(shape, in, d);
  for (unsigned lane = 0; lane < 32; ++lane)
    std::memcpy(mma_operands(lanes[lane]).d, d[lane], sizeof d[lane]);
}

// An ldmatrix of the whole warp: the rows the lanes read as they arrived
// are dealt out, and every lane's registers written, before any lane runs on.
void complete_ldmatrix(SimThread* lanes) {
  const mma::LdmatrixLane& first = ldmatrix_operands(lanes[0]);
  uint16_t rows[32][8];
  for (unsigned lane = 0; lane < 32; ++lane)
    std::memcpy(rows[lane], ldmatrix_operands(lanes[lane]).row, sizeof rows[lane]);
  uint32_t d[32][4];
  mma::ldmatrix_compute(first.count, first.trans, rows, d);
  // Copies of constant sizes, which the compiler inlines: a memcpy call would
  // reach TSan's interceptor as the host thread writing the fibers' stacks.
  for (unsigned lane = 0; lane < 32; ++lane) {
    uint32_t* out = ldmatrix_operands(lanes[lane]).d;
    switch (first.count) {
      case 1: std::memcpy(out, d[lane], 4); break;
      case 2: std::memcpy(out, d[lane], 8); break;
      default: std::memcpy(out, d[lane], 16); break;
    }
  }
}

}  // namespace

// Completes every pending warp collective of the block, or explains why one
// can never complete. Every live fiber waits somewhere when this runs, so a
// lane named by a mask either waits in the same collective (complete it),
// or never will (report it). Writes each participant's result before any
// of them resumes, so no lane can overwrite a value another still reads.
std::string resolve_warps(SimThread* threads, size_t n) {
  for (size_t w0 = 0; w0 < n; w0 += 32) {
    SimThread* lanes = threads + w0;
    const unsigned count = static_cast<unsigned>(std::min<size_t>(32, n - w0));
    const unsigned exists = count == 32 ? ~0u : (1u << count) - 1;
    auto fail = [&](unsigned lane, const std::string& why) {
      const SimThread& t = lanes[lane];
      const std::string how =
          is_matrix_op(t.op)
              ? std::string(" ") + variant_name(t) + " at " + site_text(call_site(t))
              : " with mask " + hex(t.mask);
      return "warp collective in block " + block_text() + ", warp " + std::to_string(w0 / 32) +
             ": lane " + std::to_string(lane) + " waits in " + op_name(t.op) + how + ", " + why;
    };
    // __activemask first: it has no mask; it answers with the lanes that
    // reached it in this round (every live lane, in converged code).
    unsigned active = 0;
    for (unsigned lane = 0; lane < count; ++lane) {
      const SimThread& t = lanes[lane];
      if (!t.done && t.wait == Wait::kWarp && !t.runnable && t.op == WarpOp::kActive)
        active |= 1u << lane;
    }
    for (unsigned rest = active; rest; rest &= rest - 1) {
      SimThread& t = lanes[std::countr_zero(rest)];
      t.result = active;
      t.runnable = true;
    }
    for (unsigned lane = 0; lane < count; ++lane) {
      SimThread& t = lanes[lane];
      if (t.done || t.wait != Wait::kWarp || t.runnable) continue;
      if (!(t.mask >> lane & 1u)) return fail(lane, "which does not name the lane itself");
      if (is_matrix_op(t.op) && count < 32)
        return fail(lane, "which needs all 32 lanes of the warp, but the block ends at lane " +
                              std::to_string(count - 1) + " of it (lane " + std::to_string(count) +
                              " does not exist)");
      if (is_shuffle(t.op) && (t.width < 1 || t.width > 32 || (t.width & (t.width - 1))))
        return fail(lane, "and width " + std::to_string(t.width) +
                              " (must be a power of two up to 32)");
      const unsigned group = t.mask & exists;
      bool later = false;  // a lane named is on its way from __activemask: wait for it
      for (unsigned rest = group; rest; rest &= rest - 1) {
        const unsigned l = static_cast<unsigned>(std::countr_zero(rest));
        const SimThread& o = lanes[l];
        if (o.runnable && o.op == WarpOp::kActive) later = true;
        if (later) break;
        auto named = [l] { return "which names lane " + std::to_string(l); };
        if (o.done) return fail(lane, named() + ": it has returned");
        if (o.wait == Wait::kBarrier) return fail(lane, named() + ": it waits at __syncthreads");
        if (o.mask != t.mask)
          return fail(lane, "but lane " + std::to_string(l) + " waits in " + op_name(o.op) +
                                " with mask " + hex(o.mask) + " (lanes of a warp in collectives "
                                "with different masks)");
        if (o.op != t.op)
          return fail(lane, "but lane " + std::to_string(l) + " waits in " + op_name(o.op) +
                                " with the same mask");
        if (is_matrix_op(t.op)) {
          if (o.arg != t.arg)
            return fail(lane, "but lane " + std::to_string(l) + " waits in " + op_name(o.op) +
                                  " " + variant_name(o));
          if (!same_site(call_site(o), call_site(t)))
            return fail(lane, "but lane " + std::to_string(l) + " waits in " + op_name(o.op) +
                                  " at " + site_text(call_site(o)) + " (a diverged warp)");
        }
      }
      if (later) continue;
      // Complete the group: every lane of it waits here with this mask.
      if (t.op == WarpOp::kMma) {
        complete_mma(lanes);
      } else if (t.op == WarpOp::kLdmatrix) {
        complete_ldmatrix(lanes);
      } else if (is_shuffle(t.op)) {
        for (unsigned rest = group; rest; rest &= rest - 1) {
          SimThread& me = lanes[std::countr_zero(rest)];
          const unsigned src = shuffle_source(me.op, me.linear % 32, me.arg, me.width);
          me.result = group >> src & 1u ? lanes[src].value : kPoison;
        }
      } else {
        unsigned ballot = 0;
        for (unsigned rest = group; rest; rest &= rest - 1) {
          const unsigned l = static_cast<unsigned>(std::countr_zero(rest));
          ballot |= (lanes[l].value != 0 ? 1u : 0u) << l;
        }
        uint64_t r = 0;
        if (t.op == WarpOp::kBallot) r = ballot;
        if (t.op == WarpOp::kAny) r = ballot != 0;
        if (t.op == WarpOp::kAll) r = ballot == group;
        for (unsigned rest = group; rest; rest &= rest - 1)
          lanes[std::countr_zero(rest)].result = r;
      }
      for (unsigned rest = group; rest; rest &= rest - 1)
        lanes[std::countr_zero(rest)].runnable = true;
    }
  }
  return {};
}

}  // namespace anvil::sim::detail
