#pragma once
/// \file
/// From a loader's prompt batch to the batch a rollout engine fills: each prompt repeated n times
/// (interleaved, so the n samples of a prompt sit together, as verl's `repeat(interleave=True)`),
/// with keys::group_ids derived from the loader's uid column. GRPO/RLOO baselines read group_ids.

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/keys.hpp"
#include "hybridrl/core/tensor_batch.hpp"

namespace hybridrl {

/// Group ids [B] int64 from the uid column: rows with equal uid get equal ids, numbered 0..G−1 in
/// the order of each uid's first appearance. A uid may be any JSON value (compared by its dump).
[[nodiscard]] inline at::Tensor group_ids_from_uid(const TensorBatch& batch) {
  const auto& uids = batch.column(keys::uid);
  std::map<std::string, int64_t> id_of;
  std::vector<int64_t> ids;
  ids.reserve(uids.size());
  for (const auto& u : uids) {
    const auto [it, fresh] = id_of.emplace(u.dump(), static_cast<int64_t>(id_of.size()));
    ids.push_back(it->second);
  }
  return at::tensor(ids, at::kLong);
}

/// Repeats every prompt `n` times, interleaved (a a b b), and writes keys::group_ids [B·n] int64:
/// equal uid = equal id, ids 0..G−1 in order of first appearance (so two rows of one prompt, and
/// two prompts with the same uid, share a group). Throws when the batch has no uid column.
[[nodiscard]] inline TensorBatch repeat_for_rollout(const TensorBatch& prompts, int64_t n) {
  HYBRIDRL_CHECK(n >= 1, fmt::format("repeat_for_rollout: n = {} is below 1", n),
                 "pass the number of responses per prompt (rollout n), at least 1");
  prompts.require({keys::uid}, "repeat_for_rollout");
  auto ids = group_ids_from_uid(prompts);
  TensorBatch out = prompts.repeat(n, /*interleave=*/true);
  out.set(keys::group_ids, ids.repeat_interleave(n));
  return out;
}

}  // namespace hybridrl
