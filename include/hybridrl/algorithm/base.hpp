#pragma once
/// \file
/// `algorithm_base<Tag, Options, Kind>`: the defaults of every optional Algorithm hook (in the
/// spirit of range-v3's view_facade), so a user's algorithm writes only what differs. Derive the
/// specialization from it and shadow what you need:
///
///     template <> struct hybridrl::Algorithm<RLOO> : algorithm_base<RLOO, RLOOOptions, DataKind::prompts> {
///       static constexpr std::string_view name = "RLOO";
///       static void compute_advantages(TensorBatch&, const options_type&, state_type&);
///       static LossOutput loss(const TensorBatch&, const options_type&, const state_type&, const LossCounts&);
///     };
///
/// A static member declared in the derived specialization hides the base's; the trainer always
/// calls `Algorithm<Tag>::hook(...)`, so it finds the derived one. The defaults read
/// `Algorithm<Tag>::needs_reference`, so shadowing that trait is enough for uses_reference.

#include <vector>

#include "hybridrl/algorithm/concepts.hpp"
#include "hybridrl/core/keys.hpp"
#include "hybridrl/core/policy.hpp"
#include "hybridrl/core/tensor_batch.hpp"
#include "hybridrl/distributed/communicator.hpp"

namespace hybridrl {

/// No per-run state (the default `state_type`).
struct NoAlgorithmState {};

/// Defaults of the optional Algorithm hooks; see the file comment.
template <class Tag, class Options, DataKind Kind>
struct algorithm_base {
  using tag = Tag;
  using options_type = Options;
  static constexpr DataKind data_kind = Kind;
  /// A critic model exists (and `value_loss` is then required).
  static constexpr bool needs_critic = false;
  /// A frozen reference model exists; uses_reference() says whether given options read it.
  static constexpr bool needs_reference = false;

  /// Per-run state of the algorithm, created once by make_state (none by default).
  using state_type = NoAlgorithmState;
  /// Builds the state for `options` (default: the empty state).
  static state_type make_state(const Options& /*options*/) { return {}; }

  /// Whether these options read reference log-probs (default: `needs_reference`), so the trainer
  /// loads and runs the reference model only when needed.
  static bool uses_reference(const Options& /*options*/) { return Algorithm<Tag>::needs_reference; }

  /// Once per mini-batch before its micro-batch loop; statistics over the whole mini-batch go
  /// into the state, reduced over `comm` (nullptr = one rank). Default: nothing.
  template <class State>
  static void prepare_mini_batch(TensorBatch& /*mini_batch*/, const Options& /*options*/,
                                 State& /*state*/, Communicator* /*comm*/) {}

  /// Once per training step after the update (e.g. a KL controller's update). Default: nothing.
  template <class State>
  static void after_step(const TensorBatch& /*batch*/, const Options& /*options*/,
                         State& /*state*/, Communicator* /*comm*/) {}

  /// Keys compute_advantages reads with `options` (default: none declared).
  static std::vector<Key> advantage_reads(const Options& /*options*/) { return {}; }
  /// Keys compute_advantages writes with `options` (default: none declared).
  static std::vector<Key> advantage_writes(const Options& /*options*/) { return {}; }
  /// Keys prepare_mini_batch reads with `options` (default: none).
  static std::vector<Key> prepare_reads(const Options& /*options*/) { return {}; }
  /// Keys loss reads with `options` (default: none declared).
  static std::vector<Key> loss_reads(const Options& /*options*/) { return {}; }
  /// Keys value_loss reads with `options` (default: none declared).
  static std::vector<Key> value_loss_reads(const Options& /*options*/) { return {}; }
};

}  // namespace hybridrl
