// Stream capture and CUDA graphs in the simulator, as the CUDA Programming
// Guide ("CUDA Graphs": "Creating a Graph Using Stream Capture",
// "Cross-stream Dependencies and Events", "Prohibited and Unhandled
// Operations", "Invalidation") and the runtime's own documentation
// (cuda_runtime_api.h, driver_types.h) specify them.
//
// What is captured. Between cudaStreamBeginCapture(s) and
// cudaStreamEndCapture(s), work queued on s runs nothing: each kernel launch,
// cudaMemcpyAsync and cudaMemsetAsync becomes a node of the capture's graph
// that depends on the stream's previous node (its frontier). An event
// recorded on a capturing stream becomes a captured event: the set of nodes
// its stream had reached. A stream that waits on a captured event joins the
// capture (its next node depends on those nodes too); the origin stream must
// wait, in turn, on an event recorded on every stream that joined, before
// cudaStreamEndCapture, which takes all of them out of capture.
//
// The rules, each with the error the runtime returns; a broken rule also
// invalidates the capture sequences involved, so that their
// cudaStreamEndCapture returns cudaErrorStreamCaptureInvalidated and no graph:
//   synchronising or querying a capturing stream, or a device one of whose
//     streams captures (cudaDeviceSynchronize)      cudaErrorStreamCaptureUnsupported
//   querying or synchronising a captured event       cudaErrorCapturedEvent
//   the legacy stream (work on stream 0, cudaMemcpy, cudaMemset) while a
//     blocking stream of its device captures          cudaErrorStreamCaptureImplicit
//   a capturing stream waiting on an event recorded outside the capture
//                                                    cudaErrorStreamCaptureIsolation
//   waiting on another capture's event               cudaErrorStreamCaptureMerge
//   a copy to or from pageable host memory (its bytes move when the call is
//     made, which a graph cannot replay)             cudaErrorStreamCaptureUnsupported
//   a potentially unsafe call (cudaMalloc, cudaFree, cudaHostAlloc,
//     cudaMallocHost, cudaFreeHost) by a thread that
//     cudaThreadExchangeStreamCaptureMode's rules prohibit from it
//                                                    cudaErrorStreamCaptureUnsupported
//   cudaStreamEndCapture on a stream that joined, not the origin
//                                                    cudaErrorStreamCaptureUnmatched
//   ... from another thread, the capture not relaxed cudaErrorStreamCaptureWrongThread
//   ... with a joined stream's work not joined back  cudaErrorStreamCaptureUnjoined
//   using a stream or event of an invalidated capture cudaErrorStreamCaptureInvalidated
// cudaStreamBeginCapture on the legacy stream, or on a stream already
// capturing, and cudaStreamEndCapture on a stream not capturing, are
// cudaErrorInvalidValue, the code its documentation lists.
//
// Where the simulator stops short of a GPU: a simulated NCCL operation on a
// capturing stream invalidates the capture (NCCL on a GPU can be captured);
// a graph's nodes run one after another in the order they were captured,
// which is a topological order of the graph (every node's dependencies were
// captured before it), where a GPU may run independent branches at once.
//
// How a graph runs. cudaGraphInstantiate copies the graph's nodes (the
// kernels' arguments are shared, as captured); cudaGraphLaunch queues the
// whole graph as one item of the stream, which runs its nodes in order when
// the stream runs. A graph launched on a capturing stream is captured as its
// nodes. The launch audit counts a graph launch as one launch (its
// cudaGraphLaunch row) and each kernel the graph runs in that kernel's row,
// with its work, as a launch run by a graph (graph_runs).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "sim/streams_internal.h"

namespace anvil_sim_rt {

struct CUgraph_st {
  int device = 0;
  std::vector<anvil::sim::detail::GraphNode> nodes;
};
struct CUgraphExec_st {
  int device = 0;
  anvil::sim::detail::GraphNodes nodes;
};

}  // namespace anvil_sim_rt

namespace {

using namespace anvil::sim::detail;

std::atomic<uint64_t> next_capture_id{0};
std::atomic<uint64_t> graph_launch_count{0};

std::atomic<int64_t>& drop_node_setting() {
  static std::atomic<int64_t> index = [] {
    const char* env = std::getenv("ANVIL_SIM_GRAPH_DROP_NODE");
    return env && *env ? int64_t(std::strtoll(env, nullptr, 10)) : int64_t{-1};
  }();
  return index;
}

// The graph's nodes as instantiated: all of them, or all but the kernel node
// set_graph_drop_node names (the nodes after it keep their order).
std::vector<anvil::sim::detail::GraphNode> instantiated(const std::vector<anvil::sim::detail::GraphNode>& nodes) {
  const int64_t drop = drop_node_setting().load();
  if (drop < 0) return nodes;
  std::vector<anvil::sim::detail::GraphNode> out;
  int64_t kernel = 0;
  for (const auto& n : nodes) {
    if (n.kind == anvil::sim::detail::WorkKind::kKernel && kernel++ == drop) continue;
    out.push_back(n);
  }
  return out;
}
// The calling thread's capture interaction mode (cudaThreadExchangeStreamCaptureMode).
thread_local cudaStreamCaptureMode t_mode = cudaStreamCaptureModeGlobal;

// Live graphs and instantiated graphs (caller holds reg().mutex).
std::set<cudaGraph_t>& graphs() {
  static auto* g = new std::set<cudaGraph_t>();
  return *g;
}
std::map<cudaGraphExec_t, std::unique_ptr<CUgraphExec_st>>& execs() {
  static auto* e = new std::map<cudaGraphExec_t, std::unique_ptr<CUgraphExec_st>>();
  return *e;
}

// Every capture sequence in progress on any device (caller holds reg().mutex).
std::vector<std::shared_ptr<Capture>> active_captures() {
  std::vector<std::shared_ptr<Capture>> out;
  for (auto& [device, list] : reg().by_device)
    for (auto& s : list)
      if (s->capture && std::find(out.begin(), out.end(), s->capture) == out.end())
        out.push_back(s->capture);
  return out;
}

void invalidate(Capture& c, const std::string& why) {
  if (c.invalid.empty()) c.invalid = why;
}

// A broken rule: the sequences invalidated, the error recorded.
cudaError_t broken(cudaError_t err, const std::string& what,
                   std::initializer_list<Capture*> captures) {
  for (Capture* c : captures)
    if (c) invalidate(*c, what);
  return fail(err, what);
}

// The blocking streams of `device` that capture (the legacy stream depends on them).
std::vector<Capture*> blocking_captures(int device) {
  std::vector<Capture*> out;
  for (auto& s : device_streams(device))
    if (!s->legacy && s->blocking && s->capture) out.push_back(s->capture.get());
  return out;
}

cudaError_t legacy_rule(const char* api, int device) {
  auto caps = blocking_captures(device);
  if (caps.empty()) return cudaSuccess;
  const std::string what = std::string(api) +
                           ": the legacy stream is used while a blocking stream of device " +
                           std::to_string(device) + " captures (it would depend on the capture)";
  for (Capture* c : caps) invalidate(*c, what);
  return fail(cudaErrorStreamCaptureImplicit, what);
}

cudaError_t invalidated(const char* api, const Capture& c) {
  return fail(cudaErrorStreamCaptureInvalidated,
              std::string(api) + ": the capture sequence was invalidated: " + c.invalid);
}

GraphNode node_of(Work& w) {
  GraphNode n;
  n.kind = w.kind;
  n.kernel = std::move(w.kernel);
  n.dst = w.dst;
  n.src = w.src;
  n.bytes = w.bytes;
  n.value = w.value;
  return n;
}

// Appends nodes (their deps relative to the block) to s's capture, the
// block's roots depending on s's frontier; s's frontier becomes the block's sinks.
void append_nodes(CUstream_st& s, const std::vector<GraphNode>& block) {
  Capture& c = *s.capture;
  const size_t base = c.nodes.size();
  std::vector<bool> has_dependent(block.size(), false);
  for (const GraphNode& n : block) {
    GraphNode copy = n;
    if (copy.deps.empty()) {
      copy.deps = s.frontier;
    } else {
      for (size_t& d : copy.deps) {
        has_dependent[d] = true;
        d += base;
      }
    }
    c.nodes.push_back(std::move(copy));
  }
  if (block.empty()) return;
  s.frontier.clear();
  for (size_t i = 0; i < block.size(); ++i)
    if (!has_dependent[i]) s.frontier.push_back(base + i);
}

// Every node `from` reaches backwards (itself included).
std::vector<bool> ancestors(const Capture& c, const std::vector<size_t>& from) {
  std::vector<bool> seen(c.nodes.size(), false);
  std::vector<size_t> todo = from;
  while (!todo.empty()) {
    const size_t n = todo.back();
    todo.pop_back();
    if (seen[n]) continue;
    seen[n] = true;
    for (size_t d : c.nodes[n].deps) todo.push_back(d);
  }
  return seen;
}

std::string stream_name(const CUstream_st& s) {
  if (s.legacy) return "the legacy stream";
  char buf[48];
  std::snprintf(buf, sizeof buf, "stream %p", static_cast<const void*>(&s));
  return buf;
}

}  // namespace

namespace anvil::sim::detail {

cudaError_t capture_work(CUstream_st& s, Work& w, const char* api, bool& captured) {
  captured = false;
  if (s.legacy) return legacy_rule(api, s.device);
  if (!s.capture) return cudaSuccess;
  if (!s.capture->invalid.empty()) return invalidated(api, *s.capture);
  if (w.kind == WorkKind::kComm)
    return broken(cudaErrorNotSupported,
                  std::string(api) + ": the simulator does not capture simulated NCCL operations "
                                     "(NCCL on a GPU can be captured)",
                  {s.capture.get()});
  captured = true;
  if (w.kind == WorkKind::kGraph) {
    append_nodes(s, *w.graph);
    return cudaSuccess;
  }
  GraphNode n = node_of(w);
  n.deps = s.frontier;
  s.capture->nodes.push_back(std::move(n));
  s.frontier = {s.capture->nodes.size() - 1};
  return cudaSuccess;
}

cudaError_t capture_pageable_copy(const CUstream_st& s, const char* api) {
  if (!s.capture) return cudaSuccess;
  if (!s.capture->invalid.empty()) return invalidated(api, *s.capture);
  return broken(cudaErrorStreamCaptureUnsupported,
                std::string(api) +
                    ": a copy to or from pageable host memory on a capturing stream (its bytes "
                    "move when the call is made; use pinned memory)",
                {s.capture.get()});
}

cudaError_t capture_record(CUevent_st& e, CUstream_st& s, bool& captured) {
  captured = false;
  if (s.legacy) {
    if (cudaError_t err = legacy_rule("cudaEventRecord", s.device); err != cudaSuccess) return err;
  }
  if (!s.capture) {
    e.capture.reset();
    e.nodes.clear();
    return cudaSuccess;
  }
  if (!s.capture->invalid.empty()) return invalidated("cudaEventRecord", *s.capture);
  e.capture = s.capture;
  e.nodes = s.frontier;
  captured = true;
  return cudaSuccess;
}

cudaError_t capture_wait(CUstream_st& s, const CUevent_st& e, bool& captured) {
  captured = false;
  if (!e.capture) {
    if (!s.capture) return s.legacy ? legacy_rule("cudaStreamWaitEvent", s.device) : cudaSuccess;
    if (!s.capture->invalid.empty()) return invalidated("cudaStreamWaitEvent", *s.capture);
    return broken(cudaErrorStreamCaptureIsolation,
                  "cudaStreamWaitEvent: a capturing stream waits on an event recorded outside "
                  "its capture",
                  {s.capture.get()});
  }
  Capture& c = *e.capture;
  if (!c.invalid.empty()) return invalidated("cudaStreamWaitEvent", c);
  if (s.legacy)
    return broken(cudaErrorStreamCaptureImplicit,
                  "cudaStreamWaitEvent: the legacy stream waits on a captured event", {&c});
  if (s.capture && s.capture.get() != &c)
    return broken(cudaErrorStreamCaptureMerge,
                  "cudaStreamWaitEvent: a stream capturing one sequence waits on an event of "
                  "another",
                  {s.capture.get(), &c});
  captured = true;
  if (!s.capture) {  // s joins the capture
    s.capture = e.capture;
    s.frontier = e.nodes;
    for (auto& member : device_streams(s.device))
      if (member.get() == &s) c.members.push_back(member);
    return cudaSuccess;
  }
  for (size_t n : e.nodes)
    if (std::find(s.frontier.begin(), s.frontier.end(), n) == s.frontier.end())
      s.frontier.push_back(n);
  return cudaSuccess;
}

cudaError_t capture_sync(const char* api, const CUstream_st* s, const CUevent_st* e, int device) {
  if (e && e->capture)
    return broken(cudaErrorCapturedEvent,
                  std::string(api) + ": the event was last recorded in a capturing stream",
                  {e->capture.get()});
  if (s && s->legacy) return legacy_rule(api, s->device);
  if (s && s->capture)
    return broken(cudaErrorStreamCaptureUnsupported,
                  std::string(api) + ": the stream is capturing (it holds no work to wait for)",
                  {s->capture.get()});
  if (device >= 0) {
    std::vector<Capture*> caps;
    for (auto& t : device_streams(device))
      if (t->capture) caps.push_back(t->capture.get());
    if (!caps.empty()) {
      const std::string what = std::string(api) + ": a stream of device " +
                               std::to_string(device) + " is capturing";
      for (Capture* c : caps) invalidate(*c, what);
      return fail(cudaErrorStreamCaptureUnsupported, what);
    }
  }
  return cudaSuccess;
}

cudaError_t capture_legacy(const char* api, int device) { return legacy_rule(api, device); }

cudaError_t capture_unsafe_call(const char* api) {
  if (t_mode == cudaStreamCaptureModeRelaxed) return cudaSuccess;
  std::lock_guard lock(reg().mutex);
  const auto me = std::this_thread::get_id();
  std::vector<Capture*> prohibiting;
  for (auto& c : active_captures()) {
    const bool mine = c->thread == me && c->mode != cudaStreamCaptureModeRelaxed;
    const bool global_elsewhere = t_mode == cudaStreamCaptureModeGlobal && c->thread != me &&
                                  c->mode == cudaStreamCaptureModeGlobal;
    if (mine || global_elsewhere) prohibiting.push_back(c.get());
  }
  if (prohibiting.empty()) return cudaSuccess;
  const std::string what = std::string(api) +
                           ": potentially unsafe during a stream capture (not captured: a graph "
                           "launch would not repeat it); cudaStreamCaptureModeRelaxed allows it";
  for (Capture* c : prohibiting) invalidate(*c, what);
  return fail(cudaErrorStreamCaptureUnsupported, what);
}

}  // namespace anvil::sim::detail

namespace anvil_sim_rt {

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed)
    return fail(cudaErrorInvalidValue, "cudaStreamBeginCapture: unknown mode");
  std::lock_guard lock(reg().mutex);
  StreamPtr s = resolve(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle, "cudaStreamBeginCapture: unknown stream");
  if (s->legacy)
    return fail(cudaErrorInvalidValue, "cudaStreamBeginCapture: the legacy stream cannot capture");
  if (s->capture)
    return fail(cudaErrorInvalidValue, "cudaStreamBeginCapture: the stream is already capturing");
  auto c = std::make_shared<Capture>();
  c->id = ++next_capture_id;
  c->device = s->device;
  c->origin = stream;
  c->thread = std::this_thread::get_id();
  c->mode = mode;
  c->members.push_back(s);
  s->capture = c;
  s->frontier.clear();
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (graph == nullptr) return fail(cudaErrorInvalidValue, "cudaStreamEndCapture: null graph pointer");
  *graph = nullptr;
  std::lock_guard lock(reg().mutex);
  StreamPtr s = resolve(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle, "cudaStreamEndCapture: unknown stream");
  if (!s->capture)
    return fail(cudaErrorInvalidValue, "cudaStreamEndCapture: the stream is not capturing");
  std::shared_ptr<Capture> c = s->capture;
  if (c->origin != stream)
    return broken(cudaErrorStreamCaptureUnmatched,
                  "cudaStreamEndCapture: the capture began on another stream", {c.get()});
  if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id())
    return fail(cudaErrorStreamCaptureWrongThread,
                "cudaStreamEndCapture: the capture began on another thread (not relaxed)");
  // Every stream that joined must have been joined back: its frontier among
  // the nodes the origin's frontier reaches.
  std::string unjoined;
  if (c->invalid.empty()) {
    const std::vector<bool> reached = ancestors(*c, s->frontier);
    for (auto& m : c->members)
      for (size_t n : m->frontier)
        if (!reached[n] && unjoined.empty())
          unjoined = stream_name(*m) + "'s work since it joined was not joined back";
  }
  for (auto& m : c->members) {
    m->capture.reset();
    m->frontier.clear();
  }
  for (auto& [handle, e] : reg().events)
    if (e->capture == c) {
      e->capture.reset();
      e->nodes.clear();
    }
  if (!c->invalid.empty())
    return fail(cudaErrorStreamCaptureInvalidated,
                "cudaStreamEndCapture: the capture was invalidated: " + c->invalid);
  if (!unjoined.empty()) return fail(cudaErrorStreamCaptureUnjoined, "cudaStreamEndCapture: " + unjoined);
  auto g = new CUgraph_st{c->device, std::move(c->nodes)};
  graphs().insert(g);
  *graph = g;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  if (status == nullptr)
    return fail(cudaErrorInvalidValue, "cudaStreamIsCapturing: null status pointer");
  std::lock_guard lock(reg().mutex);
  StreamPtr s = resolve(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle, "cudaStreamIsCapturing: unknown stream");
  if (s->legacy && !blocking_captures(s->device).empty())
    return fail(cudaErrorStreamCaptureImplicit,
                "cudaStreamIsCapturing: the legacy stream while a blocking stream captures");
  *status = !s->capture                  ? cudaStreamCaptureStatusNone
            : s->capture->invalid.empty() ? cudaStreamCaptureStatusActive
                                          : cudaStreamCaptureStatusInvalidated;
  return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  if (mode == nullptr)
    return fail(cudaErrorInvalidValue, "cudaThreadExchangeStreamCaptureMode: null pointer");
  std::swap(*mode, t_mode);
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (exec == nullptr) return fail(cudaErrorInvalidValue, "cudaGraphInstantiate: null pointer");
  std::lock_guard lock(reg().mutex);
  if (!graphs().contains(graph))
    return fail(cudaErrorInvalidValue, "cudaGraphInstantiate: unknown graph");
  auto e = std::make_unique<CUgraphExec_st>();
  e->device = graph->device;
  e->nodes = std::make_shared<const std::vector<GraphNode>>(instantiated(graph->nodes));
  *exec = e.get();
  execs()[e.get()] = std::move(e);
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  Work w;
  w.kind = WorkKind::kGraph;
  {
    std::lock_guard lock(reg().mutex);
    auto it = execs().find(exec);
    if (it == execs().end())
      return fail(cudaErrorInvalidValue, "cudaGraphLaunch: unknown executable graph");
    w.graph = it->second->nodes;
  }
  graph_launch_count.fetch_add(1, std::memory_order_relaxed);
  return enqueue(stream, std::move(w), "cudaGraphLaunch").error;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  std::lock_guard lock(reg().mutex);  // a launch still queued keeps its nodes
  if (execs().erase(exec) == 0)
    return fail(cudaErrorInvalidValue, "cudaGraphExecDestroy: unknown executable graph");
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  std::lock_guard lock(reg().mutex);
  if (graphs().erase(graph) == 0) return fail(cudaErrorInvalidValue, "cudaGraphDestroy: unknown graph");
  delete graph;
  return cudaSuccess;
}

cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* count) {
  if (count == nullptr || nodes != nullptr)
    return fail(cudaErrorInvalidValue,
                "cudaGraphGetNodes: the simulator gives the count only (nodes must be null)");
  std::lock_guard lock(reg().mutex);
  if (!graphs().contains(graph)) return fail(cudaErrorInvalidValue, "cudaGraphGetNodes: unknown graph");
  *count = graph->nodes.size();
  return cudaSuccess;
}

}  // namespace anvil_sim_rt

namespace anvil::sim {

uint64_t graph_launches() { return graph_launch_count.load(std::memory_order_relaxed); }
void set_graph_drop_node(int64_t index) { drop_node_setting().store(index); }

}  // namespace anvil::sim
