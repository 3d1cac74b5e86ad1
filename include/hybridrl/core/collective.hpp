#pragma once
/// \file
/// Collectives on TensorBatch over a c10d process group (Gloo on CPU, NCCL on CUDA).
///
/// The functions are templates over the group type, so this header needs no c10d include: any
/// `collective_group` works — `c10d::ProcessGroup` (1.13 and 2.x), `c10d::Backend` and its
/// subclasses such as `c10d::ProcessGroupGloo` / `ProcessGroupNCCL` on 2.x.

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <concepts>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/tensor_batch.hpp"

namespace hybridrl {

/// A process group that can all-gather: `getRank()`, `getSize()` and
/// `allgather(std::vector<std::vector<at::Tensor>>&, std::vector<at::Tensor>&)->wait()`.
template <class G>
concept collective_group = requires(G& g, std::vector<std::vector<at::Tensor>>& out,
                                    std::vector<at::Tensor>& in) {
  { g.getRank() } -> std::convertible_to<int>;
  { g.getSize() } -> std::convertible_to<int>;
  g.allgather(out, in)->wait();
};

namespace detail {

/// All-gathers one tensor of identical shape and dtype on every rank; returns one per rank.
template <collective_group G>
std::vector<at::Tensor> all_gather_same_shape(G& group, const at::Tensor& t) {
  std::vector<at::Tensor> in{t.contiguous()};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < group.getSize(); ++r) out[0].push_back(at::empty_like(in[0]));
  group.allgather(out, in)->wait();
  return out[0];
}

/// dtype in which a tensor travels: Gloo lacks bool and bfloat16, so those go as uint8 / float32
/// (both conversions are exact) and come back to their own dtype after the gather.
inline at::ScalarType wire_dtype(at::ScalarType t) {
  if (t == at::kBool) return at::kByte;
  if (t == at::kBFloat16) return at::kFloat;
  return t;
}

/// Rank-local description sent ahead of the tensors: sizes, schema, non-tensor columns.
inline nlohmann::json describe_for_gather(const TensorBatch& b) {
  nlohmann::json schema = nlohmann::json::object();
  for (const auto& [k, t] : b.tensors()) {
    schema[k] = {{"dtype", std::string(c10::toString(t.scalar_type()))},
                 {"trailing_shape", t.sizes().slice(1).vec()}};
  }
  nlohmann::json columns = nlohmann::json::object();
  for (const auto& [k, c] : b.columns()) columns[k] = c;
  return {{"size", b.size()}, {"schema", schema}, {"columns", columns}};
}

}  // namespace detail

/// Gathers every rank's batch and returns their concatenation in rank order (the same result on
/// every rank). Ranks may hold different numbers of samples; tensor keys, dtypes and trailing
/// shapes must agree (checked on every rank, so all ranks throw together rather than hang).
/// Non-tensor columns travel too; metadata stays local, as in verl's all_gather_data_proto.
/// `device` is where the gathered tensors travel (default: the batch's device, else CPU); NCCL
/// groups need CUDA tensors.
template <collective_group G>
TensorBatch all_gather(const TensorBatch& batch, G& group, std::optional<at::Device> device = {}) {
  const int world = group.getSize();
  at::Device dev = device.value_or(batch.tensors().empty() ? at::Device(at::kCPU)
                                                           : batch.tensors().begin()->second.device());

  // 1. Exchange the descriptions (variable length: gather lengths, then padded bytes).
  const std::string mine = detail::describe_for_gather(batch).dump();
  auto lens = detail::all_gather_same_shape(
      group, at::full({1}, static_cast<int64_t>(mine.size()), at::TensorOptions(at::kLong)).to(dev));
  int64_t max_len = 0;
  for (auto& l : lens) max_len = std::max(max_len, l.template item<int64_t>());
  auto bytes = at::zeros({max_len}, at::TensorOptions(at::kByte));
  std::memcpy(bytes.template data_ptr<uint8_t>(), mine.data(), mine.size());
  auto all_bytes = detail::all_gather_same_shape(group, bytes.to(dev));
  std::vector<nlohmann::json> desc;
  for (int r = 0; r < world; ++r) {
    auto cpu = all_bytes[static_cast<size_t>(r)].to(at::kCPU);
    const auto n = static_cast<size_t>(lens[static_cast<size_t>(r)].template item<int64_t>());
    desc.push_back(nlohmann::json::parse(
        std::string(reinterpret_cast<const char*>(cpu.template data_ptr<uint8_t>()), n)));
  }
  for (int r = 1; r < world; ++r) {
    HYBRIDRL_CHECK(desc[static_cast<size_t>(r)]["schema"] == desc[0]["schema"],
                   fmt::format("all_gather: rank {}'s tensors {} differ from rank 0's {}", r,
                               desc[static_cast<size_t>(r)]["schema"].dump(),
                               desc[0]["schema"].dump()),
                   "give every rank the same tensor keys, dtypes and trailing shapes (pad "
                   "sequences to a common length first)");
    HYBRIDRL_CHECK(desc[static_cast<size_t>(r)]["columns"].size() == desc[0]["columns"].size(),
                   fmt::format("all_gather: rank {} has a different set of non-tensor columns", r),
                   "give every rank the same column keys");
  }

  // 2. Gather each tensor, padded to the largest rank's row count, then trim each part.
  std::vector<int64_t> sizes;
  int64_t max_rows = 0;
  for (const auto& d : desc) {
    sizes.push_back(d["size"].template get<int64_t>());
    max_rows = std::max(max_rows, sizes.back());
  }
  std::vector<TensorBatch> parts(static_cast<size_t>(world));
  for (const auto& [key, local] : batch.tensors()) {
    const auto wire = detail::wire_dtype(local.scalar_type());
    auto shape = local.sizes().vec();
    shape[0] = max_rows;
    auto padded = at::zeros(shape, local.options().dtype(wire).device(dev));
    if (local.size(0) > 0) padded.slice(0, 0, local.size(0)).copy_(local.to(dev, wire));
    auto gathered = max_rows > 0 ? detail::all_gather_same_shape(group, padded)
                                 : std::vector<at::Tensor>(static_cast<size_t>(world), padded);
    for (int r = 0; r < world; ++r) {
      parts[static_cast<size_t>(r)].set(
          key, gathered[static_cast<size_t>(r)].slice(0, 0, sizes[static_cast<size_t>(r)])
                   .to(local.scalar_type()));
    }
  }
  for (int r = 0; r < world; ++r) {
    for (const auto& [key, values] : desc[static_cast<size_t>(r)]["columns"].items()) {
      parts[static_cast<size_t>(r)].set_column(key, values.template get<Column>());
    }
  }
  auto out = TensorBatch::concat(parts);
  out.set_meta(batch.meta());
  return out;
}

}  // namespace hybridrl
