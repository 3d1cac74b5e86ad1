#pragma once
/// \file
/// BatchLoader<Policy, Dataset>: the loader object both Loader policies return from `make`. It
/// plans each epoch from the unit lengths (the policy's `plan_epoch` hook, seeded per epoch),
/// collates batches (the policy's `collate` hook), optionally on a background thread
/// (Prefetcher), and tracks its position as a small LoaderState that serialises to JSON.
///
/// Position semantics: state() is the position after the last batch next() returned. After the
/// last batch of epoch e it is {epoch: e + 1, batch_in_epoch: 0} — there is no "exhausted epoch e"
/// state, so a loader resumed from a checkpoint taken at an epoch end starts epoch e + 1 and skips
/// nothing (the StatefulDataLoader bug verl users hit).
///
/// Batches carry no metadata: where a batch sits in its epoch (BatchInfo) is loader state, read
/// with info() after next(), and token counts are recomputed from the masks (token_counts), so
/// two consecutive batches concat (TensorBatch::concat(parts, loader.padding())) and a slice
/// never carries another batch's facts.

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/keys.hpp"
#include "hybridrl/core/tensor_batch.hpp"
#include "hybridrl/data/collate.hpp"
#include "hybridrl/data/dataset.hpp"
#include "hybridrl/data/prefetch.hpp"
#include "hybridrl/io/json.hpp"

namespace hybridrl {

/// Where a loader is: the batches of epoch `epoch` before `batch_in_epoch` have been returned.
/// A checkpoint saves it (to_json) and a resumed loader continues exactly from it.
struct LoaderState {
  uint64_t seed = 0;           ///< the run's shuffle seed
  int64_t epoch = 0;           ///< current epoch, from 0
  int64_t batch_in_epoch = 0;  ///< batches of `epoch` already returned
  int64_t dataset_size = -1;   ///< units in the dataset (checked on resume); -1 = unknown
  std::string loader;          ///< policy name ("Bucketed", "Packed"), checked on resume

  bool operator==(const LoaderState&) const = default;
};

/// nlohmann::json serialisation of LoaderState (found by ADL: `json j = state;`).
inline void to_json(nlohmann::json& j, const LoaderState& s) {
  j = nlohmann::json{{"seed", s.seed},
                     {"epoch", s.epoch},
                     {"batch_in_epoch", s.batch_in_epoch},
                     {"dataset_size", s.dataset_size},
                     {"loader", s.loader}};
}

/// Reads a LoaderState; a missing or mistyped field throws hybridrl::Error.
inline void from_json(const nlohmann::json& j, LoaderState& s) {
  const auto fail = [&](const std::string& why) {
    // io::brief: bounded, and never throws on strings that are not UTF-8 (dump() would)
    return Error(fmt::format("loader state {} is not valid ({})", io::brief(j), why),
                 "pass the object that LoaderState's to_json wrote into the checkpoint");
  };
  // get<uint64_t>() of -1 wraps and get<int64_t>() accepts negatives: range-check before converting
  const auto count = [&](const char* key, int64_t min) {
    const auto& v = j.at(key);
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX) ||
        (!v.is_number_unsigned() && v.get<int64_t>() < min)) {
      throw fail(fmt::format("\"{}\" is {}, expected an integer >= {}", key, io::brief(v), min));
    }
    return v.get<int64_t>();
  };
  try {
    if (!j.is_object()) throw fail(fmt::format("it is a JSON {}, expected an object", j.type_name()));
    const auto& seed = j.at("seed");
    if (!seed.is_number_unsigned() && !(seed.is_number_integer() && seed.get<int64_t>() >= 0)) {
      throw fail(fmt::format("\"seed\" is {}, expected an integer >= 0", io::brief(seed)));
    }
    s.seed = seed.get<uint64_t>();
    s.epoch = count("epoch", 0);
    s.batch_in_epoch = count("batch_in_epoch", 0);
    s.dataset_size = j.contains("dataset_size") ? count("dataset_size", -1) : -1;
    s.loader = j.value("loader", std::string{});
  } catch (const nlohmann::json::exception& e) {
    throw fail(e.what());
  }
}

/// Where the last batch next() returned sits, and what it holds (returned beside the batch, not in
/// its metadata: these facts describe the whole batch and would go stale in a slice).
struct BatchInfo {
  int64_t epoch = 0;             ///< epoch of the batch, from 0
  int64_t step_in_epoch = 0;     ///< index of the batch in its epoch
  int64_t batches_in_epoch = 0;  ///< batches of that epoch
  bool epoch_end = false;        ///< the epoch's last batch
  int64_t units = 0;             ///< units (prompts, pairs, completions) in the batch
  int64_t real_tokens = 0;       ///< non-padding tokens (token_counts)
  int64_t padded_tokens = 0;     ///< all positions (token_counts)

  bool operator==(const BatchInfo&) const = default;
};

/// Counters of a loader: the dataset's reading statistics plus what was produced.
struct LoaderStatistics {
  DataStatistics data;          ///< lines read, skipped by reason, ...
  int64_t batches = 0;          ///< batches returned by next()
  int64_t units = 0;            ///< units (prompts, pairs, completions) in them
  int64_t real_tokens = 0;      ///< non-padding tokens
  int64_t padded_tokens = 0;    ///< all positions (real + padding)
  int64_t prefetch_waits = 0;   ///< times next() waited on an empty prefetch queue after the first
  double prefetch_wait_seconds = 0.0;

  /// Padding positions ÷ all positions over the batches returned so far (the one meaning of
  /// "padding waste" in the library).
  [[nodiscard]] double padding_waste() const noexcept {
    return padded_tokens == 0 ? 0.0
                              : 1.0 - static_cast<double>(real_tokens) / static_cast<double>(padded_tokens);
  }
  /// The counters as JSON (for the metrics log).
  [[nodiscard]] nlohmann::json to_json() const {
    return {{"data", data.to_json()},        {"batches", batches},
            {"units", units},                {"real_tokens", real_tokens},
            {"padded_tokens", padded_tokens}, {"padding_waste", padding_waste()},
            {"prefetch_waits", prefetch_waits}, {"prefetch_wait_seconds", prefetch_wait_seconds}};
  }
};

/// The loader object of Loader<Bucketed> and Loader<Packed>: `next()` yields batches in a
/// deterministic, resumable order. Create it with `Loader<P>::make(dataset, options, state)`.
template <class Policy, dataset D>
class BatchLoader {
 public:
  using policy = Policy;
  using options_type = typename Policy::options_type;
  using dataset_type = D;

  /// Validates options against the data before any work, then starts prefetching. `resume` is a
  /// state from a checkpoint (its seed, size and loader name must match), or empty for a fresh run.
  BatchLoader(std::shared_ptr<const D> data, options_type options,
              std::optional<LoaderState> resume = std::nullopt)
      : core_(std::make_unique<Core>()) {
    HYBRIDRL_CHECK(data != nullptr, "loader: no dataset given", "pass a dataset");
    options.validate();
    core_->data = std::move(data);
    core_->options = std::move(options);
    const auto& d = *core_->data;
    HYBRIDRL_CHECK(d.size() > 0,
                   fmt::format("loader: the dataset has no samples ({} lines read, {} skipped)",
                               d.statistics().lines, d.statistics().skipped_total()),
                   "check the dataset path and format (docs/data.md); skipped lines are listed in "
                   "the dataset's statistics().first_skips");
    Policy::check_data(d.longest_sequence(), D::sequences_per_unit, D::data_kind, core_->options);
    core_->lengths.resize(static_cast<size_t>(d.size()));
    for (int64_t i = 0; i < d.size(); ++i) core_->lengths[static_cast<size_t>(i)] = d.unit_length(i);

    LoaderState s;
    s.seed = core_->options.seed();
    s.dataset_size = d.size();
    s.loader = std::string(Policy::name);
    if (resume) {
      HYBRIDRL_CHECK(resume->seed == s.seed,
                     fmt::format("loader: resuming a state with seed {} but loader.seed = {}",
                                 resume->seed, s.seed),
                     "keep loader.seed unchanged when resuming, or start without the saved state");
      HYBRIDRL_CHECK(resume->dataset_size < 0 || resume->dataset_size == s.dataset_size,
                     fmt::format("loader: the saved state was taken on {} samples, this dataset has {}",
                                 resume->dataset_size, s.dataset_size),
                     "resume with the same dataset file and dataset options (max lengths, on_error)");
      HYBRIDRL_CHECK(resume->loader.empty() || resume->loader == s.loader,
                     fmt::format("loader: the saved state belongs to Loader<{}>, this is Loader<{}>",
                                 resume->loader, s.loader),
                     "resume with the same Loader policy");
      HYBRIDRL_CHECK(resume->epoch >= 0 && resume->batch_in_epoch >= 0,
                     fmt::format("loader: saved position (epoch {}, batch {}) is negative",
                                 resume->epoch, resume->batch_in_epoch),
                     "pass the state the loader returned");
      s.epoch = resume->epoch;
      s.batch_in_epoch = resume->batch_in_epoch;
      const int64_t n = batches_in_epoch(s.epoch);
      HYBRIDRL_CHECK(s.batch_in_epoch <= n,
                     fmt::format("loader: saved position is batch {} of epoch {}, which has only {} "
                                 "batches",
                                 s.batch_in_epoch, s.epoch, n),
                     "resume with the same dataset and loader options as the saved run");
      if (s.batch_in_epoch == n) s = {s.seed, s.epoch + 1, 0, s.dataset_size, s.loader};
    }
    HYBRIDRL_CHECK(batches_in_epoch(s.epoch) > 0,
                   fmt::format("loader: an epoch of {} samples yields no batch (batch_size = {}, "
                               "drop_last = {})",
                               d.size(), core_->options.batch_size(), core_->options.drop_last()),
                   "lower the batch size (data.train_batch_size under a Trainer) or set drop_last(false)");
    core_->state = s;
    core_->producer_state = s;
    if (core_->options.prefetch_factor() > 0) {
      Core* c = core_.get();
      core_->prefetcher = std::make_unique<Prefetcher<Produced>>([c] { return c->produce(); },
                                                                 core_->options.prefetch_factor());
    }
  }

  BatchLoader(BatchLoader&&) noexcept = default;
  BatchLoader& operator=(BatchLoader&&) noexcept = default;

  /// The next per-sequence batch (keys in docs/data.md, no metadata), or std::nullopt once
  /// `options.epochs()` epochs are done (never with epochs = 0). info() describes it afterwards.
  /// Rethrows errors of the prefetch thread.
  std::optional<TensorBatch> next() {
    std::optional<Produced> p = core_->prefetcher ? core_->prefetcher->next() : core_->produce();
    if (!p) return std::nullopt;
    core_->state = p->after;
    core_->info = p->info;
    auto& st = core_->stats;
    ++st.batches;
    st.units += p->info.units;
    st.real_tokens += p->info.real_tokens;
    st.padded_tokens += p->info.padded_tokens;
    return std::move(p->batch);
  }

  /// The position after the last batch returned (what a checkpoint saves).
  [[nodiscard]] LoaderState state() const { return core_->state; }

  /// Epoch, step and token counts of the last batch next() returned (all zero before the first).
  [[nodiscard]] const BatchInfo& info() const noexcept { return core_->info; }

  /// How this loader's batches pad, for TensorBatch::concat of batches of different widths:
  /// prompt batches on the prompt padding side, full sequences on the right; "<role>input_ids"
  /// with the dataset's pad id, every other key with 0.
  [[nodiscard]] ConcatPadding padding() const {
    ConcatPadding p;
    p.side = D::data_kind == DataKind::prompts ? prompt_side() : PaddingSide::right;
    for (auto role : keys::roles) p.values[keys::with_role(role, keys::input_ids)] = core_->data->pad_id();
    return p;
  }

  /// Number of batches epoch `epoch` has (token-budget batching can vary it between epochs).
  [[nodiscard]] int64_t batches_in_epoch(int64_t epoch) const {
    return static_cast<int64_t>(
        Policy::plan_epoch(core_->lengths, D::sequences_per_unit, core_->options, epoch).size());
  }

  /// Counters so far, including the dataset's skipped lines and the prefetch waits.
  [[nodiscard]] LoaderStatistics statistics() const {
    auto s = core_->stats;
    s.data = core_->data->statistics();
    if (core_->prefetcher) {
      s.prefetch_waits = core_->prefetcher->waits();
      s.prefetch_wait_seconds = core_->prefetcher->wait_seconds();
    }
    return s;
  }

  [[nodiscard]] const D& dataset() const { return *core_->data; }
  [[nodiscard]] const options_type& options() const { return core_->options; }

 private:
  struct Produced {
    TensorBatch batch;
    LoaderState after;
    BatchInfo info;
  };

  [[nodiscard]] PaddingSide prompt_side() const {
    if constexpr (requires { core_->options.prompt_padding(); }) {
      return core_->options.prompt_padding();
    } else {
      return PaddingSide::left;
    }
  }

  // Everything the worker touches lives here, at a stable address, so a BatchLoader can move.
  struct Core {
    std::shared_ptr<const D> data;
    options_type options;
    std::vector<int64_t> lengths;
    LoaderState state;           // consumer side: after the last returned batch
    LoaderState producer_state;  // producer side: the next batch to build
    int64_t planned_epoch = -1;
    std::vector<std::vector<int64_t>> plan;
    LoaderStatistics stats;
    BatchInfo info;
    std::unique_ptr<Prefetcher<Produced>> prefetcher;  // declared last: stopped first

    ~Core() { prefetcher.reset(); }

    std::optional<Produced> produce() {
      auto& s = producer_state;
      if (options.epochs() > 0 && s.epoch >= options.epochs()) return std::nullopt;
      if (planned_epoch != s.epoch) {
        plan = Policy::plan_epoch(lengths, D::sequences_per_unit, options, s.epoch);
        planned_epoch = s.epoch;
      }
      const auto& units = plan[static_cast<size_t>(s.batch_in_epoch)];
      Produced p;
      p.batch = Policy::collate(*data, std::span<const int64_t>(units), options);
      const auto n = static_cast<int64_t>(plan.size());
      const auto tokens = token_counts(p.batch);
      p.info = {s.epoch, s.batch_in_epoch, n, s.batch_in_epoch + 1 == n,
                static_cast<int64_t>(units.size()), tokens.real, tokens.padded};
      if (options.pin_memory() && at::hasCUDA()) {
        for (const auto& key : p.batch.tensor_keys()) p.batch.set(key, p.batch.tensor(key).pin_memory());
      }
      if (++s.batch_in_epoch == n) {
        ++s.epoch;
        s.batch_in_epoch = 0;
      }
      p.after = s;
      return p;
    }
  };

  std::unique_ptr<Core> core_;
};

}  // namespace hybridrl
