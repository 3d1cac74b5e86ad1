#pragma once
/// \file
/// Collectives on a whole TensorBatch through a Communicator (any backend: Gloo, NCCL, threads).
///
/// all_gather concatenates every rank's batch in rank order, as verl's all_gather_data_proto:
/// ranks may hold different numbers of samples, tensors travel padded to the largest rank, and
/// non-tensor columns travel as JSON. broadcast gives every rank the root's batch. A rank whose
/// batch cannot be described (a column with invalid UTF-8) or whose keys differ from the others'
/// makes EVERY rank throw the same Error: ranks exchange an ok flag before anything else, so no
/// rank is left waiting in a collective the failing rank never makes.

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/tensor_batch.hpp"
#include "hybridrl/distributed/communicator.hpp"

namespace hybridrl {

namespace detail {

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

/// The first non-finite number (NaN or inf) in `b`'s columns, as "column 'k' row i", or "" when
/// there is none. JSON has no NaN: nlohmann would send it as null, silently. Walks each value with
/// an explicit stack (no recursion).
inline std::string first_non_finite(const TensorBatch& b) {
  for (const auto& [k, c] : b.columns()) {
    for (size_t i = 0; i < c.size(); ++i) {
      std::vector<const nlohmann::json*> todo{&c[i]};
      while (!todo.empty()) {
        const auto* v = todo.back();
        todo.pop_back();
        if (v->is_number_float() && !std::isfinite(v->get<double>())) return fmt::format("column '{}' row {}", k, i);
        if (v->is_structured()) {
          for (const auto& x : *v) todo.push_back(&x);
        }
      }
    }
  }
  return {};
}

/// Serializes the description; on failure returns nullopt and the reason in `error`.
inline std::optional<std::string> serialize_for_gather(const TensorBatch& b, std::string& error) {
  if (const auto where = first_non_finite(b); !where.empty()) {
    error = where + " holds a NaN or infinite number, which JSON cannot carry (it would arrive as null)";
    return std::nullopt;
  }
  try {
    return describe_for_gather(b).dump();
  } catch (const nlohmann::json::exception& e) {
    error = e.what();
    return std::nullopt;
  }
}

/// Every rank's (ok, byte length) pair, by all_gather_into of two int64 per rank. Throws on every
/// rank together when a rank is not ok.
inline std::vector<int64_t> exchange_lengths(Communicator& comm, const std::optional<std::string>& mine,
                                             const std::string& error, at::Device dev,
                                             const char* what) {
  const int world = comm.size();
  auto local = at::tensor(std::vector<int64_t>{mine ? 1 : 0, mine ? static_cast<int64_t>(mine->size()) : 0},
                          at::TensorOptions(at::kLong)).to(dev);
  auto all = at::empty({2 * world}, local.options());
  comm.all_gather_into(all, local);
  all = all.to(at::kCPU);
  std::vector<int> failed;
  std::vector<int64_t> lens;
  for (int r = 0; r < world; ++r) {
    if (all[2 * r].item<int64_t>() == 0) failed.push_back(r);
    lens.push_back(all[2 * r + 1].item<int64_t>());
  }
  HYBRIDRL_CHECK(failed.empty(),
                 fmt::format("{}: the non-tensor columns of rank(s) {} cannot be serialized{}", what,
                             fmt::join(failed, ", "), mine ? "" : " (here: " + error + ")"),
                 "keep column strings valid UTF-8 (decode tokens with replacement characters) and "
                 "column values JSON-representable (finite numbers; NaN and inf belong in a tensor); "
                 "every rank threw this error");
  return lens;
}

/// Variable-length bytes from every rank (padded to the longest, then trimmed).
inline std::vector<std::string> all_gather_bytes(Communicator& comm, const std::string& mine,
                                                 const std::vector<int64_t>& lens, at::Device dev) {
  const int64_t max_len = std::max<int64_t>(1, *std::max_element(lens.begin(), lens.end()));
  auto bytes = at::zeros({max_len}, at::TensorOptions(at::kByte));
  std::memcpy(bytes.data_ptr<uint8_t>(), mine.data(), mine.size());
  auto all = at::empty({comm.size() * max_len}, bytes.options().device(dev));
  comm.all_gather_into(all, bytes.to(dev));
  all = all.to(at::kCPU).contiguous();
  std::vector<std::string> out;
  for (int r = 0; r < comm.size(); ++r) {
    const auto* p = reinterpret_cast<const char*>(all.data_ptr<uint8_t>()) + r * max_len;
    out.emplace_back(p, static_cast<size_t>(lens[static_cast<size_t>(r)]));
  }
  return out;
}

/// The keys of a JSON object, in its (sorted) order.
inline std::vector<std::string> keys_of(const nlohmann::json& object) {
  std::vector<std::string> out;
  for (const auto& [k, v] : object.items()) out.push_back(k);
  return out;
}

/// Where a batch's tensors travel: `device`, else the batch's device, else the CPU.
inline at::Device travel_device(const TensorBatch& batch, std::optional<at::Device> device) {
  return device.value_or(batch.tensors().empty() ? at::Device(at::kCPU)
                                                 : batch.tensors().begin()->second.device());
}

}  // namespace detail

/// Gathers every rank's batch and returns their concatenation in rank order (the same result on
/// every rank). Ranks may hold different numbers of samples; tensor keys, dtypes, trailing shapes
/// and column names must agree (checked on every rank, so all ranks throw together rather than
/// hang). Metadata stays local. `device` is where the tensors travel (default: the batch's device,
/// else CPU); NCCL needs CUDA.
inline TensorBatch all_gather(const TensorBatch& batch, Communicator& comm,
                              std::optional<at::Device> device = {}) {
  const int world = comm.size();
  const at::Device dev = detail::travel_device(batch, device);

  // 1. ok flag and description length, then the descriptions themselves.
  std::string error;
  const auto mine = detail::serialize_for_gather(batch, error);
  const auto lens = detail::exchange_lengths(comm, mine, error, dev, "all_gather");
  const auto texts = detail::all_gather_bytes(comm, *mine, lens, dev);
  std::vector<nlohmann::json> desc;
  for (const auto& t : texts) desc.push_back(nlohmann::json::parse(t));
  for (int r = 1; r < world; ++r) {
    const auto& d = desc[static_cast<size_t>(r)];
    HYBRIDRL_CHECK(d["schema"] == desc[0]["schema"],
                   fmt::format("all_gather: rank {}'s tensors {} differ from rank 0's {}", r,
                               d["schema"].dump(), desc[0]["schema"].dump()),
                   "give every rank the same tensor keys, dtypes and trailing shapes (pad "
                   "sequences to a common length first)");
    const auto names = detail::keys_of(d["columns"]), names0 = detail::keys_of(desc[0]["columns"]);
    HYBRIDRL_CHECK(names == names0,
                   fmt::format("all_gather: rank {}'s non-tensor columns [{}] differ from rank 0's [{}]",
                               r, fmt::join(names, ", "), fmt::join(names0, ", ")),
                   "give every rank the same column keys");
  }

  // 2. Each tensor, padded to the largest rank's row count, then each part trimmed.
  std::vector<int64_t> sizes;
  int64_t max_rows = 0;
  for (const auto& d : desc) {
    sizes.push_back(d["size"].get<int64_t>());
    max_rows = std::max(max_rows, sizes.back());
  }
  std::vector<TensorBatch> parts(static_cast<size_t>(world));
  for (const auto& [key, local] : batch.tensors()) {
    auto shape = local.sizes().vec();
    shape[0] = max_rows;
    auto padded = at::zeros(shape, local.options().device(dev));
    if (local.size(0) > 0) padded.slice(0, 0, local.size(0)).copy_(local);
    shape[0] = max_rows * world;
    auto gathered = at::empty(shape, padded.options());
    if (max_rows > 0) comm.all_gather_into(gathered, padded);
    for (int r = 0; r < world; ++r) {
      parts[static_cast<size_t>(r)].set(
          key, gathered.slice(0, r * max_rows, r * max_rows + sizes[static_cast<size_t>(r)]));
    }
  }
  for (int r = 0; r < world; ++r) {
    for (const auto& [key, values] : desc[static_cast<size_t>(r)]["columns"].items()) {
      parts[static_cast<size_t>(r)].set_column(key, values.get<Column>());
    }
  }
  auto out = TensorBatch::concat(parts);
  out.set_meta(batch.meta());
  return out;
}

/// Every rank gets rank `root`'s batch (tensors and columns; metadata stays local). The other
/// ranks' `batch` only gives the device (pass an empty batch); a root whose columns cannot be
/// serialized makes every rank throw.
inline TensorBatch broadcast(const TensorBatch& batch, Communicator& comm, int root,
                             std::optional<at::Device> device = {}) {
  HYBRIDRL_CHECK(root >= 0 && root < comm.size(),
                 fmt::format("broadcast: root = {} is not a rank of this group of {}", root, comm.size()),
                 "give a root in [0, size())");
  const at::Device dev = detail::travel_device(batch, device);
  std::string error;
  std::optional<std::string> mine = std::string();
  if (comm.rank() == root) mine = detail::serialize_for_gather(batch, error);
  auto lens = detail::exchange_lengths(comm, mine, error, dev, "broadcast");
  const auto len = lens[static_cast<size_t>(root)];
  auto bytes = at::zeros({std::max<int64_t>(1, len)}, at::TensorOptions(at::kByte));
  if (comm.rank() == root) std::memcpy(bytes.data_ptr<uint8_t>(), mine->data(), mine->size());
  bytes = bytes.to(dev);
  comm.broadcast(bytes, root);
  bytes = bytes.to(at::kCPU).contiguous();
  const auto desc = nlohmann::json::parse(
      std::string(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), static_cast<size_t>(len)));
  const auto rows = desc["size"].get<int64_t>();
  TensorBatch out;
  for (const auto& [key, info] : desc["schema"].items()) {
    std::vector<int64_t> shape{rows};
    for (auto s : info["trailing_shape"]) shape.push_back(s.get<int64_t>());
    at::Tensor t;
    if (comm.rank() == root) {
      t = batch.tensor(key).to(dev).contiguous().clone();
    } else {
      const auto dtype_name = info["dtype"].get<std::string>();
      at::ScalarType dtype = at::kFloat;
      bool found = false;
      for (auto st : {at::kByte, at::kChar, at::kShort, at::kInt, at::kLong, at::kHalf, at::kFloat,
                      at::kDouble, at::kBool, at::kBFloat16}) {
        if (dtype_name == c10::toString(st)) dtype = st, found = true;
      }
      HYBRIDRL_CHECK(found, fmt::format("broadcast: tensor '{}' has dtype {}, which does not travel", key, dtype_name),
                     "broadcast tensors of a standard integer, floating or bool dtype");
      t = at::empty(shape, at::TensorOptions(dtype).device(dev));
    }
    if (t.numel() > 0) comm.broadcast(t, root);
    out.set(key, t);
  }
  for (const auto& [key, values] : desc["columns"].items()) out.set_column(key, values.get<Column>());
  out.set_meta(batch.meta());
  return out;
}

}  // namespace hybridrl
