#pragma once
/// \file
/// hybridrl's own communication interface: the collectives sharding, algorithms and TensorBatch
/// need, over one process group (a rank's data-, tensor- or pipeline-parallel group of a device
/// mesh). Implementations: C10dCommunicator (Gloo on CPU, NCCL on CUDA; the only code that
/// includes c10d) and ThreadCommunicator (ranks as threads of one process, for unit tests of
/// multi-rank components). A virtual call per collective costs nothing next to the collective.
///
/// Every call is collective: all ranks of the group make it, in the same order, with tensors of the
/// same shape and dtype (except where noted). Calls are synchronous (they return when the result
/// is in the output tensor). Every dtype works on every backend (the Gloo adapter sends bool and
/// bfloat16 as uint8 / float32); ReduceOp::avg needs a floating-point tensor.
///
/// Set-up: `init_from_environment()` (distributed/c10d_communicator.hpp) under torchrun or Slurm;
/// `run_ranks(n, fn)` (distributed/thread_communicator.hpp) in tests; `DeviceMesh`
/// (distributed/device_mesh.hpp) for the data x tensor x pipeline sub-groups.

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

namespace hybridrl {

/// How all_reduce and reduce_scatter combine the ranks' tensors (sum of bools is logical or).
enum class ReduceOp { sum, avg, max, min };

/// A group of ranks that run collectives together.
class Communicator {
 public:
  virtual ~Communicator() = default;

  /// This process's rank in the group, in [0, size()).
  [[nodiscard]] virtual int rank() const = 0;
  /// Ranks in the group.
  [[nodiscard]] virtual int size() const = 0;
  /// "gloo", "nccl", "thread", ... (for messages and the printed layout).
  [[nodiscard]] virtual std::string backend() const = 0;

  /// In place: every rank's `t` becomes the reduction over ranks.
  virtual void all_reduce(at::Tensor& t, ReduceOp op = ReduceOp::sum) = 0;
  /// `out` = concat over ranks (rank-major along dim 0) of each rank's `in`;
  /// out.size(0) == size() * in.size(0).
  virtual void all_gather_into(at::Tensor& out, const at::Tensor& in) = 0;
  /// `out` = this rank's slice (dim 0, rank-major) of the reduction of every rank's `in`;
  /// in.size(0) == size() * out.size(0).
  virtual void reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op = ReduceOp::sum) = 0;
  /// In place: every rank's `t` becomes rank `root`'s.
  virtual void broadcast(at::Tensor& t, int root) = 0;
  /// Returns when every rank has called it.
  virtual void barrier() = 0;
  /// Point to point: sends `t` to rank `dst` of this group (blocking).
  virtual void send(const at::Tensor& t, int dst, int tag = 0) = 0;
  /// Point to point: receives into `t` (shape and dtype known to the receiver) from rank `src`.
  virtual void recv(at::Tensor& t, int src, int tag = 0) = 0;
  /// A sub-group of `ranks` (ranks of THIS group, ascending). Collective over this whole group:
  /// every rank calls it with the same list; ranks outside the list get nullptr.
  [[nodiscard]] virtual std::shared_ptr<Communicator> split(const std::vector<int>& ranks) = 0;
};

/// Mean of `t` over the ranks of `comm` (a new tensor; `t` is unchanged). nullptr means one rank:
/// a copy of `t`. For per-step statistics every rank needs, such as KTO's reference point z0.
inline at::Tensor all_reduce_mean(Communicator* comm, const at::Tensor& t) {
  auto out = t.detach().clone();
  if (comm != nullptr && comm->size() > 1) comm->all_reduce(out, ReduceOp::avg);
  return out;
}

}  // namespace hybridrl
