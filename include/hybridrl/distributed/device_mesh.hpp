#pragma once
/// \file
/// DeviceMesh: the world's ranks laid out as data x tensor x pipeline, each rank's coordinates and
/// its three sub-communicators (made with Communicator::split). Rank order as Megatron's default:
/// tensor fastest, then data, pipeline slowest,
///
///     rank = (pipeline * data_size + data) * tensor_size + tensor,
///
/// so a tensor-parallel group is a block of neighbouring ranks (one node's GPUs).
/// An axis of size 1 gets a one-rank ThreadCommunicator (no c10d group is built for it); an axis
/// as large as the world shares the world communicator.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/distributed/communicator.hpp"
#include "hybridrl/distributed/thread_communicator.hpp"

namespace hybridrl {

/// The three axes of a DeviceMesh.
enum class MeshAxis { data, tensor, pipeline };

/// Sizes of the mesh axes; their product is the world size.
struct MeshShape {
  int data = 1;      ///< data-parallel size (-1: world / (tensor * pipeline))
  int tensor = 1;    ///< tensor-parallel size
  int pipeline = 1;  ///< pipeline-parallel size

  /// The shape for `world` ranks with data = -1 resolved; throws when the sizes do not multiply
  /// to `world`.
  [[nodiscard]] MeshShape resolved(int world) const {
    HYBRIDRL_CHECK(tensor >= 1 && pipeline >= 1 && (data >= 1 || data == -1),
                   fmt::format("mesh sizes data = {}, tensor = {}, pipeline = {}: each must be >= 1 "
                               "(data may be -1)", data, tensor, pipeline),
                   "give positive sizes; data = -1 takes what the world leaves");
    MeshShape out = *this;
    if (data == -1) {
      HYBRIDRL_CHECK(world % (tensor * pipeline) == 0,
                     fmt::format("the world of {} ranks does not divide into tensor = {} x "
                                 "pipeline = {}", world, tensor, pipeline),
                     "choose tensor and pipeline sizes whose product divides the world size");
      out.data = world / (tensor * pipeline);
    }
    HYBRIDRL_CHECK(out.data * out.tensor * out.pipeline == world,
                   fmt::format("mesh data = {} x tensor = {} x pipeline = {} = {} ranks, but the "
                               "world has {}", out.data, out.tensor, out.pipeline,
                               out.data * out.tensor * out.pipeline, world),
                   "choose sizes whose product is the world size (or data = -1)");
    return out;
  }
};

/// A rank's place in the mesh.
struct MeshCoordinates {
  int data = 0;
  int tensor = 0;
  int pipeline = 0;
  bool operator==(const MeshCoordinates&) const = default;
};

/// The world's ranks as data x tensor x pipeline, with this rank's sub-communicators.
class DeviceMesh {
 public:
  /// Lays `world` out as `shape` (collective: every rank builds the mesh with the same shape).
  DeviceMesh(std::shared_ptr<Communicator> world, MeshShape shape)
      : world_(std::move(world)), shape_(shape.resolved(world_->size())) {
    coords_ = coordinates(shape_, world_->rank());
    for (auto axis : {MeshAxis::data, MeshAxis::tensor, MeshAxis::pipeline}) {
      const int n = axis_size(shape_, axis);
      auto& slot = groups_[static_cast<size_t>(axis)];
      if (n == 1) {
        slot = ThreadCommunicator::world(1)[0];
      } else if (n == world_->size()) {
        slot = world_;
      } else {
        // Every rank calls split for every group of the axis, in the same order.
        for (const auto& ranks : all_groups(shape_, axis)) {
          auto g = world_->split(ranks);
          if (g) slot = std::move(g);
        }
      }
    }
  }

  /// The resolved shape.
  [[nodiscard]] const MeshShape& shape() const noexcept { return shape_; }
  /// This rank's coordinates.
  [[nodiscard]] const MeshCoordinates& coordinates() const noexcept { return coords_; }
  /// The whole world.
  [[nodiscard]] Communicator& world() const { return *world_; }
  /// The ranks that share this rank's tensor and pipeline coordinates (gradients are averaged here).
  [[nodiscard]] Communicator& data() const { return *groups_[0]; }
  /// The ranks that share this rank's data and pipeline coordinates (a layer's shards).
  [[nodiscard]] Communicator& tensor() const { return *groups_[1]; }
  /// The ranks that share this rank's data and tensor coordinates (the pipeline stages).
  [[nodiscard]] Communicator& pipeline() const { return *groups_[2]; }
  /// The sub-communicator of `axis`, shared.
  [[nodiscard]] std::shared_ptr<Communicator> group(MeshAxis axis) const {
    return groups_[static_cast<size_t>(axis)];
  }

  /// Size of `axis` in `shape`.
  static int axis_size(const MeshShape& shape, MeshAxis axis) {
    switch (axis) {
      case MeshAxis::data: return shape.data;
      case MeshAxis::tensor: return shape.tensor;
      case MeshAxis::pipeline: return shape.pipeline;
    }
    return 1;
  }

  /// Coordinates of world rank `rank` in a resolved `shape`.
  static MeshCoordinates coordinates(const MeshShape& shape, int rank) {
    return {(rank / shape.tensor) % shape.data, rank % shape.tensor,
            rank / (shape.tensor * shape.data)};
  }

  /// World rank at coordinates `c` of a resolved `shape`.
  static int rank_of(const MeshShape& shape, const MeshCoordinates& c) {
    return (c.pipeline * shape.data + c.data) * shape.tensor + c.tensor;
  }

  /// The world ranks of `rank`'s group along `axis`, ascending.
  static std::vector<int> group_ranks(const MeshShape& shape, MeshAxis axis, int rank) {
    auto c = coordinates(shape, rank);
    std::vector<int> out;
    for (int i = 0; i < axis_size(shape, axis); ++i) {
      auto m = c;
      (axis == MeshAxis::data ? m.data : axis == MeshAxis::tensor ? m.tensor : m.pipeline) = i;
      out.push_back(rank_of(shape, m));
    }
    return out;
  }

  /// Every group along `axis`, each ascending, ordered by their first rank.
  static std::vector<std::vector<int>> all_groups(const MeshShape& shape, MeshAxis axis) {
    std::vector<std::vector<int>> out;
    const int world = shape.data * shape.tensor * shape.pipeline;
    for (int r = 0; r < world; ++r) {
      auto g = group_ranks(shape, axis, r);
      if (g.front() == r) out.push_back(std::move(g));
    }
    return out;
  }

 private:
  std::shared_ptr<Communicator> world_;
  MeshShape shape_;
  MeshCoordinates coords_;
  std::array<std::shared_ptr<Communicator>, 3> groups_;
};

}  // namespace hybridrl
