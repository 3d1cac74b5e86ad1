#pragma once
/// \file
/// Placement at run time (placement.*, trainer/options.hpp): the process group's sub-groups for
/// the actor and the frozen models, and the exchange that takes a step's batch (a rollout batch
/// online, the loader's rows offline) to the ranks that score it and their scores back.
///
/// One exchange, every rank of the group in it (collective):
///   1. the actor's ranks pad their rows — a rollout batch to the actor's longest prompt and
///      response, an offline batch each token tensor to its widest — and all-gather them (rank
///      order); with ranks outside the actor, rank 0 broadcasts the whole batch to every rank;
///   2. the scorers (the reference's or the reward's ranks) take equal shares of it (padded by
///      repeated rows to a multiple of their count: a sharded model's forwards run in lock step)
///      and score them; an error on a scorer travels with its share, so every rank throws it;
///   3. each scorer's share is broadcast to every rank; each actor rank keeps its own rows, their
///      token-aligned columns cut back to its own width (the response length online, the
///      input_ids width offline).
/// Ranks outside the actor wait in a loop for rank 0's signal (score rewards, score the
/// reference, done, or the actor stopped with an error) and take part in each exchange.

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/keys.hpp"
#include "hybridrl/core/tensor_batch.hpp"
#include "hybridrl/distributed/batch_collectives.hpp"
#include "hybridrl/distributed/communicator.hpp"
#include "hybridrl/rollout/generation.hpp"
#include "hybridrl/trainer/options.hpp"

namespace hybridrl {

/// The group of `ranks` of `world` (ascending): `world` itself when they are all of its ranks,
/// else world->split(ranks) — collective over `world`, nullptr on a rank outside the list.
inline std::shared_ptr<Communicator> placement_group(const std::shared_ptr<Communicator>& world,
                                                     const std::vector<int64_t>& ranks) {
  const int64_t n = world ? world->size() : 1;
  if (static_cast<int64_t>(ranks.size()) == n) return world;
  std::vector<int> r(ranks.begin(), ranks.end());
  return world->split(r);
}

namespace detail {

/// An error every rank of an exchange throws together (no rank is left in a collective).
struct PlacedError : Error {
  using Error::Error;
};

/// What rank 0 signals to the ranks outside the actor.
enum class PlacedOp : int64_t { done = 0, reward = 1, reference = 2, abort = 3 };

/// The groups of a placement map on this rank. Collective to make: every rank splits alike.
struct Placement {
  std::shared_ptr<Communicator> world;             ///< the whole group (nullptr: one process)
  std::vector<int64_t> actor, reference, reward;   ///< each model's ranks
  std::shared_ptr<Communicator> actor_comm;        ///< the actor's group (nullptr off it or alone)
  std::shared_ptr<Communicator> reference_comm;    ///< the reference's group when apart (else nullptr)
  int64_t rank = 0;
  bool reference_apart = false;  ///< the reference's ranks are not the actor's: its scores travel
  bool reward_apart = false;     ///< the reward's ranks are not the actor's

  [[nodiscard]] static bool holds(const std::vector<int64_t>& ranks, int64_t r) {
    return std::binary_search(ranks.begin(), ranks.end(), r);
  }
  [[nodiscard]] bool in_actor() const { return holds(actor, rank); }
  [[nodiscard]] bool in_reference() const { return holds(reference, rank); }
  [[nodiscard]] bool in_reward() const { return holds(reward, rank); }
  /// Ranks outside the actor exist (they wait for rank 0's signals).
  [[nodiscard]] bool has_servers() const {
    return world && static_cast<int64_t>(actor.size()) < world->size();
  }
  /// "actor 0-1, reference 2-3, reward 2-3" (lists shortened to ranges; `online` false: no
  /// reward, which an offline run has none of).
  [[nodiscard]] std::string describe(bool online = true) const {
    auto list = [](const std::vector<int64_t>& r) {
      std::vector<std::string> parts;
      for (size_t i = 0; i < r.size();) {
        size_t j = i;
        while (j + 1 < r.size() && r[j + 1] == r[j] + 1) ++j;
        parts.push_back(j == i ? std::to_string(r[i]) : fmt::format("{}-{}", r[i], r[j]));
        i = j + 1;
      }
      return fmt::format("{}", fmt::join(parts, ","));
    };
    return fmt::format("actor {}, reference {}{}", list(actor), list(reference),
                       online ? ", reward " + list(reward) : std::string());
  }
};

/// The placement of `p` over `world` (checked: check_world). Splits the actor's group when it is
/// not the whole group, and the reference's when it is not the actor's.
inline Placement make_placement(const std::shared_ptr<Communicator>& world, const PlacementOptions& p,
                                bool online) {
  Placement pl;
  const int64_t n = world ? world->size() : 1;
  p.check_world(n, online);
  pl.world = world;
  pl.rank = world ? world->rank() : 0;
  pl.actor = p.actor_ranks(n);
  pl.reference = p.reference_ranks(n);
  pl.reward = p.reward_ranks(n);
  pl.actor_comm = placement_group(world, pl.actor);
  pl.reference_apart = pl.reference != pl.actor;
  pl.reward_apart = pl.reward != pl.actor;
  if (pl.reference_apart) pl.reference_comm = placement_group(world, pl.reference);
  return pl;
}

/// Rank 0's signal to every rank of the world: [op, a, b] (the others' arguments are ignored).
inline std::array<int64_t, 3> placed_signal(Communicator& world, at::Device dev, PlacedOp op = PlacedOp::done,
                                            int64_t a = 0, int64_t b = 0) {
  auto t = at::tensor(std::vector<int64_t>{static_cast<int64_t>(op), a, b}, at::kLong).to(dev);
  world.broadcast(t, 0);
  t = t.to(at::kCPU);
  return {t[0].item<int64_t>(), t[1].item<int64_t>(), t[2].item<int64_t>()};
}

/// The rows of a rollout batch that travel to scorers: the token tensors (prompts, responses,
/// masks, input ids, positions), every per-row tensor (1-D: group ids, ...) and, with `columns`,
/// the dataset's columns (what a reward reads).
inline TensorBatch travelling_rows(const TensorBatch& batch, bool columns) {
  TensorBatch out;
  for (const auto& k : {keys::prompts, keys::responses, keys::response_mask, keys::input_ids, keys::attention_mask,
                        keys::position_ids}) {
    if (batch.has_tensor(k.str())) out.set(k.str(), batch.tensor(k));
  }
  for (const auto& [k, t] : batch.tensors()) {
    if (t.dim() == 1 && !out.has_tensor(k)) out.set(k, t);
  }
  if (columns) {
    for (const auto& [k, c] : batch.columns()) out.set_column(k, c);
  }
  return out;
}

/// `batch` (a rollout batch) padded to the longest prompt and response over the ranks of `comm`
/// and all-gathered in rank order: every rank gets the group's rows (collective; on `dev`).
inline TensorBatch gather_rollout_rows(const TensorBatch& batch, Communicator& comm, int64_t pad_id, at::Device dev) {
  auto longest = at::tensor(std::vector<int64_t>{batch.tensor(keys::prompts).size(1), batch.tensor(keys::responses).size(1)},
                            at::kLong)
                     .to(dev);
  comm.all_reduce(longest, ReduceOp::max);
  longest = longest.to(at::kCPU);
  return all_gather(pad_rollout_batch(batch, longest[0].item<int64_t>(), longest[1].item<int64_t>(), pad_id), comm, dev);
}

/// `batch` (an offline batch: every rank the same keys) with each 2-D tensor right-padded with 0
/// to its widest over the ranks of `comm` (its masks 0 there: the padding is not scored) and
/// all-gathered in rank order (collective; on `dev`).
inline TensorBatch gather_padded_rows(const TensorBatch& batch, Communicator& comm, at::Device dev) {
  std::vector<int64_t> widths;
  for (const auto& [k, t] : batch.tensors()) {
    if (t.dim() == 2) widths.push_back(t.size(1));
  }
  TensorBatch padded = batch;
  if (!widths.empty()) {
    auto longest = at::tensor(widths, at::kLong).to(dev);
    comm.all_reduce(longest, ReduceOp::max);
    longest = longest.to(at::kCPU);
    int64_t i = 0;
    for (const auto& [k, t] : batch.tensors()) {
      if (t.dim() != 2) continue;
      const auto w = longest[i++].item<int64_t>();
      if (w > t.size(1)) padded.set(k, at::constant_pad_nd(t, {0, w - t.size(1)}, 0));
    }
  }
  return all_gather(padded, comm, dev);
}

/// Whether `batch` is a rollout batch (prompts and responses) rather than an offline one.
inline bool is_rollout_batch(const TensorBatch& batch) {
  return batch.has_tensor(keys::prompts.str()) && batch.has_tensor(keys::responses.str());
}

/// Step 1: every rank of the world gets the actor's whole batch. `mine` is this actor rank's
/// batch (nullptr off the actor).
inline TensorBatch placed_whole(const TensorBatch* mine, const Placement& pl, int64_t pad_id, bool columns,
                                at::Device dev) {
  TensorBatch whole;
  if (mine != nullptr) {
    const bool rollout = is_rollout_batch(*mine);
    if (rollout) {
      whole = travelling_rows(*mine, columns);
    } else {  // an offline batch: all of it is input
      for (const auto& [k, t] : mine->tensors()) whole.set(k, t);
      if (columns) {
        for (const auto& [k, c] : mine->columns()) whole.set_column(k, c);
      }
    }
    if (pl.actor_comm && pl.actor_comm->size() > 1) {
      whole = rollout ? gather_rollout_rows(whole, *pl.actor_comm, pad_id, dev)
                      : gather_padded_rows(whole, *pl.actor_comm, dev);
    }
  }
  if (pl.has_servers()) whole = broadcast(whole, *pl.world, 0, dev);
  return whole.to(dev);
}

/// Steps 2 and 3: the scorers `ranks` score equal shares of `whole` with `score` (called on a
/// scorer only; returns a batch of its share's rows); every rank gets every row's scores, in
/// `whole`'s order.
inline TensorBatch placed_scores(const TensorBatch& whole, const Placement& pl, const std::vector<int64_t>& ranks,
                                 const std::function<TensorBatch(const TensorBatch&)>& score, at::Device dev) {
  const auto k = static_cast<int64_t>(ranks.size());
  const auto rows = whole.size();
  const auto padded = whole.pad_to_divisor(k);
  const auto share = padded.batch.size() / k;
  TensorBatch out;
  if (Placement::holds(ranks, pl.rank)) {
    const auto index = std::lower_bound(ranks.begin(), ranks.end(), pl.rank) - ranks.begin();
    try {
      out = score(padded.batch.slice(index * share, (index + 1) * share));
    } catch (const Error& e) {
      out = TensorBatch().set_column("placement_error", Column{Value(e.problem()), Value(e.fix())});
    } catch (const std::exception& e) {
      out = TensorBatch().set_column("placement_error", Column{Value(std::string(e.what())), Value("")});
    }
  }
  std::vector<TensorBatch> parts;
  for (const auto r : ranks) {
    auto part = broadcast(out, *pl.world, static_cast<int>(r), dev);
    if (part.has_column("placement_error")) {
      const auto& c = part.column("placement_error");
      throw PlacedError(fmt::format("rank {} (scoring for ranks {}): {}", r, fmt::join(ranks, ","),
                                    c[0].get<std::string>()),
                        c[1].get<std::string>());
    }
    parts.push_back(std::move(part));
  }
  return TensorBatch::concat(parts).slice(0, rows);
}

/// Step 3's end: this actor rank's rows of the exchange's result, token-aligned tensors ([rows, W]
/// of the padded batch) cut to `mine`'s own width — its response length online, its input_ids
/// width offline — on `dev`.
inline TensorBatch placed_rows(const TensorBatch& scores, const Placement& pl, const TensorBatch& mine, at::Device dev) {
  const auto actors = static_cast<int64_t>(pl.actor.size());
  const auto index = std::lower_bound(pl.actor.begin(), pl.actor.end(), pl.rank) - pl.actor.begin();
  HYBRIDRL_CHECK(scores.size() == mine.size() * actors,
                 fmt::format("placement: {} scored rows for {} actor ranks of {} rows each", scores.size(), actors,
                             mine.size()),
                 "give every actor rank the same number of rows (data.train_batch_size a multiple of the actor's ranks)");
  const auto own = scores.slice(index * mine.size(), (index + 1) * mine.size());
  const bool rollout = is_rollout_batch(mine);
  const int64_t R = rollout                                       ? mine.tensor(keys::responses).size(1)
                    : mine.has_tensor(keys::input_ids.str()) ? mine.tensor(keys::input_ids).size(1)
                                                              : -1;
  TensorBatch out;
  for (const auto& [key, t] : own.tensors()) {
    auto v = t;
    HYBRIDRL_CHECK(v.dim() < 2 || R >= 0,
                   fmt::format("placement: the scorers' '{}' is per token, but this offline batch has no input_ids "
                               "to align it with", key),
                   "have the reference produce per-row values (the *_log_probs_sum keys) for this data kind, or "
                   "leave placement.reference unset");
    if (v.dim() >= 2 && v.size(1) > R) v = v.narrow(1, 0, R);
    out.set(key, v.contiguous().to(dev));
  }
  return out;
}

/// One whole exchange on an actor rank or a server: every rank of the world calls it alike.
/// Errors of the exchange (a scorer's, a batch that cannot travel) are PlacedError: every rank
/// throws the same one.
inline TensorBatch placed_exchange(const TensorBatch* mine, const Placement& pl, const std::vector<int64_t>& scorers,
                                   const std::function<TensorBatch(const TensorBatch&)>& score, int64_t pad_id,
                                   bool columns, at::Device dev) {
  try {
    const auto whole = placed_whole(mine, pl, pad_id, columns, dev);
    auto scores = placed_scores(whole, pl, scorers, score, dev);
    return mine != nullptr ? placed_rows(scores, pl, *mine, dev) : TensorBatch();
  } catch (const PlacedError&) {
    throw;
  } catch (const Error& e) {
    throw PlacedError(e.problem(), e.fix());
  }
}

}  // namespace detail
}  // namespace hybridrl
