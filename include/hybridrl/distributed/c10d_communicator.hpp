#pragma once
/// \file
/// C10dCommunicator: the Communicator over PyTorch's c10d process groups — Gloo on CPU, NCCL on
/// CUDA (HYBRIDRL_WITH_NCCL). The ONLY hybridrl header that includes c10d, so c10d's differences
/// between LibTorch 1.13 (collectives on c10d::ProcessGroup) and 2.x (on c10d::Backend) stay here.
///
/// - `init_from_environment(options)`: under torchrun or Slurm (distributed/environment.hpp),
///   rank 0 serves a TCPStore at MASTER_ADDR:MASTER_PORT, every rank connects within
///   `store_timeout_s`, and the world group is built over it.
/// - `C10dCommunicator(store, rank, size, options)`: a group over any c10d store (a HashStore for
///   ranks as threads, a FileStore, ...).
/// - split() builds a new process group over a PrefixStore of the same store, as
///   torch.distributed.new_group does.
///
/// What the backends lack is filled in here: ReduceOp::avg is a sum divided by size() (Gloo has
/// no AVG; NCCL only from 2.10), Gloo's reduce_scatter is an all-reduce and a slice (1.13's Gloo
/// has none), Gloo tensors travel on the CPU and bool / bfloat16 travel as uint8 / float32 (exact).

#include "hybridrl/detail/compat.hpp"  // first: HYBRIDRL_TORCH_MAJOR

// LibTorch guards ProcessGroupGloo.hpp / ProcessGroupNCCL.hpp behind USE_C10D_GLOO / USE_C10D_NCCL,
// which its CMake target usually defines. The pip wheels of 2.x ship no gloo headers: then there
// is no Gloo backend (define HYBRIDRL_NO_GLOO to drop it where the gloo headers found do not
// match LibTorch's own build).
#if !defined(USE_C10D_GLOO) && !defined(HYBRIDRL_NO_GLOO) && __has_include(<gloo/config.h>)
#define USE_C10D_GLOO 1
#endif
#if !defined(USE_C10D_NCCL) && defined(HYBRIDRL_WITH_NCCL)
#define USE_C10D_NCCL 1
#endif
#if defined(USE_C10D_GLOO) && !defined(HYBRIDRL_NO_GLOO) && __has_include(<gloo/config.h>)
#define HYBRIDRL_HAS_GLOO 1
#else
#define HYBRIDRL_HAS_GLOO 0
#endif
#if defined(HYBRIDRL_WITH_NCCL)
#define HYBRIDRL_HAS_NCCL 1
#else
#define HYBRIDRL_HAS_NCCL 0
#endif

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if HYBRIDRL_TORCH_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif
#if HYBRIDRL_HAS_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#if HYBRIDRL_HAS_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <thread>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/distributed/communicator.hpp"
#include "hybridrl/distributed/environment.hpp"

namespace hybridrl {

namespace detail {
#if HYBRIDRL_TORCH_MAJOR >= 2
/// The c10d class whose virtual collectives a Gloo/NCCL group implements (2.x: Backend).
using C10dBackend = c10d::Backend;
#else
/// The c10d class whose virtual collectives a Gloo/NCCL group implements (1.13: ProcessGroup).
using C10dBackend = c10d::ProcessGroup;
#endif
}  // namespace detail

/// How a C10dCommunicator is built: backend, timeouts, rendezvous port and Gloo network device.
struct C10dOptions {
  /// "gloo", "nccl", or "auto" (NCCL when built with it and CUDA is present, else Gloo).
  HYBRIDRL_ARG(std::string, backend) = "auto";
  /// Longest wait of one collective (c10d's process-group timeout), seconds.
  HYBRIDRL_ARG(double, timeout_s) = 1800.0;
  /// Longest wait for the TCPStore rendezvous (rank 0 for every rank, every rank for rank 0).
  HYBRIDRL_ARG(double, store_timeout_s) = 300.0;
  /// Rendezvous port under Slurm when MASTER_PORT is unset.
  HYBRIDRL_ARG(int, default_port) = 29500;
  /// Gloo: network interface to bind ("" = GLOO_SOCKET_IFNAME, else by host name).
  HYBRIDRL_ARG(std::string, gloo_interface) = "";
  /// Gloo: address to bind ("" = this machine's host name; "127.0.0.1" for one machine).
  HYBRIDRL_ARG(std::string, gloo_hostname) = "";

  HYBRIDRL_FIELDS(backend, timeout_s, store_timeout_s, default_port, gloo_interface, gloo_hostname)

  /// Throws an Error naming the first invalid field.
  void validate() const {
    HYBRIDRL_CHECK(backend_ == "auto" || backend_ == "gloo" || backend_ == "nccl",
                   fmt::format("backend = '{}' is not a c10d backend", backend_),
                   "use \"gloo\" (CPU), \"nccl\" (CUDA) or \"auto\"");
    HYBRIDRL_CHECK(timeout_s_ > 0, fmt::format("timeout_s = {} must be > 0", timeout_s_),
                   "give the longest wait of one collective in seconds (default 1800)");
    HYBRIDRL_CHECK(store_timeout_s_ > 0,
                   fmt::format("store_timeout_s = {} must be > 0", store_timeout_s_),
                   "give the longest rendezvous wait in seconds (default 300)");
    HYBRIDRL_CHECK(default_port_ >= 1 && default_port_ <= 65535,
                   fmt::format("default_port = {} must lie in [1, 65535]", default_port_),
                   "give a free TCP port (default 29500)");
  }

  /// The backend "auto" resolves to here.
  [[nodiscard]] std::string resolved_backend() const {
    if (backend_ != "auto") return backend_;
#if HYBRIDRL_HAS_NCCL
    if (at::hasCUDA()) return "nccl";
#endif
    return "gloo";
  }
};

namespace detail {

/// Seconds (an Options value) as c10d's milliseconds.
inline std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

/// Runs a c10d call; turns its exception (timeout, peer gone) into an Error naming the operation.
template <class F>
void c10d_call(const std::string& backend, const char* what, F&& f) {
  try {
    f();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(fmt::format("{} over {} failed: {}", what, backend, e.what()),
                "check that every rank calls the same collectives in the same order with tensors "
                "of the same shape and dtype, that no rank died, and that timeout_s is long enough");
  }
}

}  // namespace detail

/// A Communicator over a c10d Gloo or NCCL process group.
class C10dCommunicator final : public Communicator {
 public:
  /// A group of `size` ranks meeting in `store` (every rank passes the same store contents and
  /// options). `prefix` namespaces the store keys (split() uses it).
  C10dCommunicator(c10::intrusive_ptr<c10d::Store> store, int rank, int size, C10dOptions options = {},
                   std::string prefix = "hybridrl")
      : store_(std::move(store)), rank_(rank), size_(size), options_(std::move(options)),
        prefix_(std::move(prefix)) {
    options_.validate();
    HYBRIDRL_CHECK(size >= 1 && rank >= 0 && rank < size,
                   fmt::format("C10dCommunicator: rank = {} must lie in [0, size = {})", rank, size),
                   "give this process's rank and the number of ranks");
    backend_name_ = options_.resolved_backend();
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix_, store_);
    if (backend_name_ == "gloo") {
#if HYBRIDRL_HAS_GLOO
      auto opts = c10d::ProcessGroupGloo::Options::create(detail::to_ms(options_.timeout_s()));
      opts->devices.push_back(gloo_device());
      detail::c10d_call("gloo", "creating the Gloo group", [&] {
        group_ = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size, opts);
      });
#else
      throw Error("backend = \"gloo\", but this LibTorch ships no gloo headers",
                  "use LibTorch with its gloo headers (e.g. Debian's libtorch-dev + libgloo-dev), "
                  "or backend \"nccl\" on CUDA");
#endif
    } else {
#if HYBRIDRL_HAS_NCCL
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = detail::to_ms(options_.timeout_s());
      detail::c10d_call("nccl", "creating the NCCL group", [&] {
        group_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, rank, size, opts);
      });
#else
      throw Error("backend = \"nccl\", but hybridrl was built without NCCL",
                  "build with HYBRIDRL_WITH_NCCL (CMake finds NCCL with CUDA), or use \"gloo\"");
#endif
    }
  }

  [[nodiscard]] int rank() const override { return rank_; }
  [[nodiscard]] int size() const override { return size_; }
  [[nodiscard]] std::string backend() const override { return backend_name_; }
  /// The c10d group (ProcessGroup on 1.13, Backend on 2.x), for calls this interface lacks.
  [[nodiscard]] const c10::intrusive_ptr<detail::C10dBackend>& group() const noexcept { return group_; }

  void all_reduce(at::Tensor& t, ReduceOp op = ReduceOp::sum) override {
    check_avg(t, op, "all_reduce");
    std::vector<at::Tensor> w{wire(t)};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d_op(op);
    call("all_reduce", [&] { group_->allreduce(w, o)->wait(); });
    if (op == ReduceOp::avg) w[0].div_(size_);
    t.copy_(w[0]);
  }

  void all_gather_into(at::Tensor& out, const at::Tensor& in) override {
    HYBRIDRL_CHECK(in.dim() >= 1 && out.dim() == in.dim() && out.size(0) == size_ * in.size(0) &&
                       out.sizes().slice(1) == in.sizes().slice(1),
                   fmt::format("all_gather_into: out has shape [{}], in [{}]; out needs {} times in's "
                               "rows and in's trailing shape", fmt::join(out.sizes(), ", "),
                               fmt::join(in.sizes(), ", "), size_),
                   "allocate out with size(0) = size() * in.size(0)");
    std::vector<at::Tensor> w{wire(in)};
    auto flat = at::empty(out.sizes(), w[0].options());
    std::vector<std::vector<at::Tensor>> outs(1);
    for (auto& part : flat.chunk(size_, 0)) outs[0].push_back(part);
    call("all_gather", [&] { group_->allgather(outs, w)->wait(); });
    out.copy_(flat);
  }

  void reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op = ReduceOp::sum) override {
    HYBRIDRL_CHECK(in.dim() >= 1 && in.size(0) == size_ * out.size(0),
                   fmt::format("reduce_scatter: in has {} rows, out {}; in needs {} times out's rows",
                               in.dim() >= 1 ? in.size(0) : 0, out.dim() >= 1 ? out.size(0) : 0, size_),
                   "allocate in with size(0) = size() * out.size(0)");
    check_avg(in, op, "reduce_scatter");
    if (backend_name_ == "gloo") {  // 1.13's Gloo has no reduce_scatter: all-reduce, then slice
      auto all = in.clone();
      all_reduce(all, op);
      out.copy_(all.chunk(size_, 0)[static_cast<size_t>(rank_)]);
      return;
    }
    std::vector<at::Tensor> w{wire(out)};
    auto flat = wire(in);
    std::vector<std::vector<at::Tensor>> ins(1);
    for (auto& part : flat.chunk(size_, 0)) ins[0].push_back(part);
    c10d::ReduceScatterOptions o;
    o.reduceOp = c10d_op(op);
    call("reduce_scatter", [&] { group_->reduce_scatter(w, ins, o)->wait(); });
    if (op == ReduceOp::avg) w[0].div_(size_);
    out.copy_(w[0]);
  }

  void broadcast(at::Tensor& t, int root) override {
    check_rank(root, "broadcast root");
    std::vector<at::Tensor> w{wire(t)};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    call("broadcast", [&] { group_->broadcast(w, o)->wait(); });
    t.copy_(w[0]);
  }

  void barrier() override {
    call("barrier", [&] { group_->barrier()->wait(); });
  }

  void send(const at::Tensor& t, int dst, int tag = 0) override {
    check_rank(dst, "send destination");
    std::vector<at::Tensor> w{wire(t)};
    call("send", [&] { group_->send(w, dst, tag)->wait(); });
  }

  void recv(at::Tensor& t, int src, int tag = 0) override {
    check_rank(src, "recv source");
    std::vector<at::Tensor> w{wire(t)};
    call("recv", [&] { group_->recv(w, src, tag)->wait(); });
    t.copy_(w[0]);
  }

  /// A new c10d group of `ranks` over a PrefixStore of this group's store. Every rank of this
  /// group calls it with the same list, in the same order as its other splits.
  [[nodiscard]] std::shared_ptr<Communicator> split(const std::vector<int>& ranks) override {
    bool ok = !ranks.empty();
    for (size_t i = 0; i < ranks.size(); ++i) {
      ok = ok && ranks[i] >= 0 && ranks[i] < size_ && (i == 0 || ranks[i] > ranks[i - 1]);
    }
    HYBRIDRL_CHECK(ok,
                   fmt::format("split: ranks [{}] must be a non-empty ascending list of ranks in "
                               "[0, {})", fmt::join(ranks, ", "), size_),
                   "list each member once, in ascending order, as ranks of the group being split");
    const auto name = fmt::format("{}/split{}:{}", prefix_, splits_++, fmt::join(ranks, ","));
    const auto it = std::find(ranks.begin(), ranks.end(), rank_);
    if (it == ranks.end()) return nullptr;
    return std::make_shared<C10dCommunicator>(store_, static_cast<int>(it - ranks.begin()),
                                              static_cast<int>(ranks.size()), options_, name);
  }

 private:
  /// Runs collective number seq_ + 1 of this group; a c10d failure (a timeout, a peer gone) is an
  /// Error naming the collective and, from the others' reports, the ranks that never reached it.
  template <class F>
  void call(const char* what, F&& f) {
    ++seq_;
    try {
      f();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw Error(fmt::format("{} over {} failed: {}{}", what, backend_name_, e.what(), missing_ranks(what)),
                  "check that every rank calls the same collectives in the same order with tensors "
                  "of the same shape and dtype, that no rank died, and that timeout_s is long enough");
    }
  }

  /// After this rank's collective `what` (number seq_) failed: reports it in the store and
  /// waits a short grace (timeout_s / 10, 0.2 to 5 s) for the other ranks' reports. A rank that
  /// failed in the same collective waited too; one that sent no report never reached it (it
  /// stalled, or died: a killed process reports nothing); one that failed in an earlier
  /// collective is named with it. Never throws: a store that cannot be reached gives "".
  std::string missing_ranks(const char* what) noexcept {
    try {
      auto reports = c10::make_intrusive<c10d::PrefixStore>(prefix_ + "/failed", store_);
      const std::string mine = fmt::format("{} {}", seq_, what);
      reports->set(std::to_string(rank_), std::vector<uint8_t>(mine.begin(), mine.end()));
      const double grace = std::clamp(options_.timeout_s() / 10.0, 0.2, 5.0);
      const auto deadline = std::chrono::steady_clock::now() + detail::to_ms(grace);
      std::vector<std::optional<std::pair<uint64_t, std::string>>> seen(static_cast<size_t>(size_));
      for (;;) {
        bool all = true;
        for (int r = 0; r < size_; ++r) {
          if (r == rank_ || seen[static_cast<size_t>(r)]) continue;
          if (reports->check({std::to_string(r)})) {
            const auto v = reports->get(std::to_string(r));
            const std::string text(v.begin(), v.end());
            const auto space = text.find(' ');
            seen[static_cast<size_t>(r)] = std::make_pair(std::stoull(text.substr(0, space)),
                                                          space == std::string::npos ? "" : text.substr(space + 1));
          } else {
            all = false;
          }
        }
        if (all || std::chrono::steady_clock::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      std::vector<int> silent;
      std::string earlier;
      for (int r = 0; r < size_; ++r) {
        const auto& s = seen[static_cast<size_t>(r)];
        if (r == rank_) continue;
        if (!s) silent.push_back(r);
        else if (s->first < seq_) earlier += fmt::format("; rank {} failed earlier, in collective #{} ({})", r, s->first, s->second);
      }
      const std::string group = prefix_ == "hybridrl" ? "" : fmt::format(" of the group {}", prefix_);
      std::string out;
      if (!silent.empty()) {
        out = fmt::format("; rank{} {}{} sent no report within {} s of this failure: stalled or died before "
                          "collective #{} ({}), which this rank was waiting in",
                          silent.size() > 1 ? "s" : "", fmt::join(silent, ", "), group, grace, seq_, what);
      }
      return out + earlier;
    } catch (...) {
      return {};
    }
  }

#if HYBRIDRL_HAS_GLOO
  std::shared_ptr<::gloo::transport::Device> gloo_device() const {
    std::string iface = options_.gloo_interface();
    if (iface.empty()) {
      if (const char* v = std::getenv("GLOO_SOCKET_IFNAME")) iface = v;
    }
    if (!iface.empty()) return c10d::ProcessGroupGloo::createDeviceForInterface(iface);
    if (!options_.gloo_hostname().empty()) {
      return c10d::ProcessGroupGloo::createDeviceForHostname(options_.gloo_hostname());
    }
    return c10d::ProcessGroupGloo::createDefaultDevice();
  }
#endif

  void check_rank(int r, const char* what) const {
    HYBRIDRL_CHECK(r >= 0 && r < size_,
                   fmt::format("{} = {} is not a rank of this group of {}", what, r, size_),
                   "give a rank in [0, size())");
  }

  static void check_avg(const at::Tensor& t, ReduceOp op, const char* what) {
    HYBRIDRL_CHECK(op != ReduceOp::avg || at::isFloatingType(t.scalar_type()),
                   fmt::format("{}: ReduceOp::avg of a {} tensor", what, c10::toString(t.scalar_type())),
                   "average floating-point tensors, or sum integers and divide yourself");
  }

  static c10d::ReduceOp c10d_op(ReduceOp op) {
    switch (op) {
      case ReduceOp::max: return c10d::ReduceOp::MAX;
      case ReduceOp::min: return c10d::ReduceOp::MIN;
      case ReduceOp::sum:
      case ReduceOp::avg: break;
    }
    return c10d::ReduceOp::SUM;
  }

  /// The tensor as it travels: contiguous, a fresh buffer (results are copied back), on the CPU in
  /// a dtype Gloo has for Gloo, on CUDA for NCCL.
  at::Tensor wire(const at::Tensor& t) const {
    if (backend_name_ == "gloo") {
      auto dtype = t.scalar_type();
      if (dtype == at::kBool) dtype = at::kByte;
      if (dtype == at::kBFloat16) dtype = at::kFloat;
      return t.detach().to(at::kCPU, dtype, /*non_blocking=*/false, /*copy=*/true).contiguous();
    }
    HYBRIDRL_CHECK(t.is_cuda(), fmt::format("NCCL needs CUDA tensors, got one on {}", t.device().str()),
                   "move the tensor to this rank's CUDA device first");
    return t.detach().clone(at::MemoryFormat::Contiguous);
  }

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  int size_;
  C10dOptions options_;
  std::string prefix_;
  std::string backend_name_;
  c10::intrusive_ptr<detail::C10dBackend> group_;
  uint64_t splits_ = 0;
  uint64_t seq_ = 0;  ///< collectives this rank has run in this group (call())
};

/// The world communicator of a torchrun or Slurm launch: parses `env` (default: the process
/// environment), meets the other ranks at a TCPStore on MASTER_ADDR:MASTER_PORT (rank 0 serves it)
/// within `options.store_timeout_s`, and builds the group. With NCCL, selects CUDA device
/// LOCAL_RANK first. Throws an Error naming a missing variable or the unreachable address.
inline std::shared_ptr<C10dCommunicator> init_from_environment(C10dOptions options = {},
                                                               const EnvLookup& env = process_environment()) {
  options.validate();
  const auto launch = parse_launch_environment(env, options.default_port());
#if HYBRIDRL_HAS_NCCL
  if (options.resolved_backend() == "nccl") {
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(launch.local_rank));
  }
#endif
  if (options.gloo_hostname().empty() &&
      (launch.master_addr == "127.0.0.1" || launch.master_addr == "localhost")) {
    options.gloo_hostname("127.0.0.1");  // one machine: bind Gloo where the store is
  }
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(launch.master_port);
  store_options.isServer = launch.rank == 0;
  store_options.numWorkers = static_cast<std::size_t>(launch.world_size);
  store_options.waitWorkers = false;  // counted below: 1.13's wait gives up silently at the timeout
  store_options.timeout = detail::to_ms(options.store_timeout_s());
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(launch.master_addr, store_options);
  } catch (const std::exception& e) {
    throw Error(fmt::format("rank {} of {} ({}) could not meet the others at the TCPStore on "
                            "MASTER_ADDR:MASTER_PORT = {}:{} within store_timeout_s = {}: {}",
                            launch.rank, launch.world_size, launch.launcher, launch.master_addr,
                            launch.master_port, options.store_timeout_s(), e.what()),
                "check that every rank was started, that MASTER_ADDR is rank 0's host reachable "
                "from every node and MASTER_PORT free there, or raise store_timeout_s");
  }
  // every rank checks in; a rank that never starts (or crashed before this point) is reported by
  // every rank that did, within store_timeout_s, instead of a hang in the first collective
  {
    const std::string key = "hybridrl/ranks_arrived";
    int64_t arrived = 0;
    try {
      arrived = store->add(key, 1);
      const auto start = std::chrono::steady_clock::now();
      while (arrived < launch.world_size) {
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (waited > options.store_timeout_s()) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        arrived = store->add(key, 0);
      }
    } catch (const std::exception& e) {
      throw Error(fmt::format("rank {} of {} ({}): the TCPStore on {}:{} failed while the ranks met: {}", launch.rank,
                              launch.world_size, launch.launcher, launch.master_addr, launch.master_port, e.what()),
                  "check that rank 0 is running and reachable from every node");
    }
    HYBRIDRL_CHECK(arrived >= launch.world_size,
                   fmt::format("rank {} of {} ({}) could not meet the others at the TCPStore on MASTER_ADDR:MASTER_PORT "
                               "= {}:{} within store_timeout_s = {}: {} of {} ranks arrived",
                               launch.rank, launch.world_size, launch.launcher, launch.master_addr, launch.master_port,
                               options.store_timeout_s(), arrived, launch.world_size),
                   "start every rank (WORLD_SIZE of them, with the same MASTER_ADDR and MASTER_PORT), or raise "
                   "store_timeout_s (distributed.store_timeout_s)");
  }
  return std::make_shared<C10dCommunicator>(store, launch.rank, launch.world_size, std::move(options));
}

}  // namespace hybridrl
