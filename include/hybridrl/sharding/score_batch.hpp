#pragma once
/// \file
/// What every sharding engine's forward() returns for a batch, in one place: the policy's
/// per-token `log_probs` and `entropy`, or the critic's `values`, aligned as core/keys.hpp says
/// (to `responses` in a rollout batch, to `input_ids` in an offline one). The engines differ in
/// what happens around it (FSDP gathers its root unit first; TP3D's model is a tensor-parallel
/// shard whose outputs are replicated), not in this.

#include <ATen/ATen.h>

#include <string_view>
#include <type_traits>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/keys.hpp"
#include "hybridrl/core/tensor_batch.hpp"
#include "hybridrl/model/causal_lm.hpp"
#include "hybridrl/model/log_probs.hpp"

namespace hybridrl::detail {

/// The policy (`Model` = CausalLM): `log_probs` and `entropy` of the batch's tokens, with grad.
/// The critic (ValueModel): `values`, the value of the state before each token (the score head at
/// the position before it; 0 at position 0), float32, with grad. Uses attention_mask,
/// position_ids and cu_seqlens (packed rows) when present; `device` is where the model computes;
/// `engine` names the caller in errors ("Sharding<FSDP>").
template <class Model>
TensorBatch score_batch(Model& model, const TensorBatch& batch, const LogProbOptions& log_prob_options,
                        const at::Device& device, std::string_view engine) {
  HYBRIDRL_CHECK(batch.has(keys::input_ids), fmt::format("{}.forward: the batch has no 'input_ids'", engine),
                 "pass a rollout batch or an offline batch (the Loader's)");
  ForwardArgs args;
  if (batch.has(keys::attention_mask)) args.attention_mask(batch.tensor(keys::attention_mask));
  if (batch.has(keys::position_ids)) args.position_ids(batch.tensor(keys::position_ids));
  if (batch.has(keys::cu_seqlens)) args.cu_seqlens(batch.tensor(keys::cu_seqlens));
  const auto ids = batch.tensor(keys::input_ids).to(device);
  auto to_responses = [&](at::Tensor x) {
    if (!batch.has(keys::responses) || !x.defined()) return x;
    const auto R = batch.tensor(keys::responses).size(1), T = x.size(1);
    return x.narrow(1, T - R, R);
  };
  if constexpr (std::is_same_v<Model, ValueModel>) {
    // values[t] = V(tokens before t): the head's output one position back, as log_probs[t] is
    // the logits one position back (verl: values[:, -R - 1:-1] of a rollout batch)
    const auto raw = model->forward(ids, args);
    const auto shifted = at::cat({at::zeros_like(raw.narrow(1, 0, 1)), raw.narrow(1, 0, raw.size(1) - 1)}, 1);
    return TensorBatch({{keys::values.str(), to_responses(shifted)}});
  } else {
    auto r = token_log_probs(model, ids, args, log_prob_options);
    TensorBatch out({{keys::log_probs.str(), to_responses(r.log_probs)}});
    if (r.entropy.defined()) out.set(keys::entropy, to_responses(r.entropy));
    return out;
  }
}

}  // namespace hybridrl::detail
