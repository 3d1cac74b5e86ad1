#pragma once
/// \file
/// The four policy axes. Each axis is ONE primary template taking a tag; built-in and user policies
/// are specializations of it. The unspecialized form fails to compile with a sentence that says
/// which tags exist and how to add your own.

#include <string_view>

#include "hybridrl/core/tags.hpp"
#include "hybridrl/detail/dependent_false.hpp"

namespace hybridrl {

/// What an algorithm trains on. Online algorithms generate their own samples from prompts.
enum class DataKind {
  prompts,               ///< PPO, GRPO, RLOO...: prompts → Rollout → reward → update
  preference_pairs,      ///< DPO: (prompt, chosen, rejected)
  labelled_completions,  ///< KTO: (prompt, completion, desirable?)
  completions,           ///< SFT: (prompt, completion)
};

/// Algorithm axis: `Algorithm<PPO>`, `Algorithm<GRPO>`, `Algorithm<DPO>`, `Algorithm<KTO>`, or yours.
template <class Tag>
struct Algorithm {
  static_assert(detail::dependent_false<Tag>,
                "hybridrl: Algorithm<Tag> is not specialized for this tag. Use one of the built-in "
                "tags PPO, GRPO, DPO, KTO (include <hybridrl/algorithm/algorithm.hpp>), or write "
                "`template <> struct hybridrl::Algorithm<YourTag> { ... };` with the hooks listed in "
                "docs/extending.md.");
  using hybridrl_unspecialized = Tag;  ///< marks the primary template (see detail::unspecialized)
};

/// Sharding axis: `Sharding<FSDP>` or `Sharding<TP3D>`.
template <class Tag>
struct Sharding {
  static_assert(detail::dependent_false<Tag>,
                "hybridrl: Sharding<Tag> is not specialized for this tag. Use Sharding<FSDP> or "
                "Sharding<TP3D> (include <hybridrl/sharding/sharding.hpp>).");
  using hybridrl_unspecialized = Tag;  ///< marks the primary template (see detail::unspecialized)
};

/// Rollout axis: `Rollout<Paged>` or `Rollout<Naive>`.
template <class Tag>
struct Rollout {
  static_assert(detail::dependent_false<Tag>,
                "hybridrl: Rollout<Tag> is not specialized for this tag. Use Rollout<Paged> or "
                "Rollout<Naive> (include <hybridrl/rollout/rollout.hpp>).");
  using hybridrl_unspecialized = Tag;  ///< marks the primary template (see detail::unspecialized)
};

/// Loader axis: `Loader<Packed>` or `Loader<Bucketed>`.
template <class Tag>
struct Loader {
  static_assert(detail::dependent_false<Tag>,
                "hybridrl: Loader<Tag> is not specialized for this tag. Use Loader<Packed> or "
                "Loader<Bucketed> (include <hybridrl/data/data.hpp>).");
  using hybridrl_unspecialized = Tag;  ///< marks the primary template (see detail::unspecialized)
};

/// Marks the absent Rollout slot of an offline trainer, `Trainer<Algorithm<DPO>, Sharding<..>, Loader<..>>`.
struct NoRollout {};

namespace detail {
/// True for an axis template used with a tag that has no specialization: its own static_assert has
/// already said so, and the Trainer's rules stay silent about it (only the first broken rule speaks).
template <class P>
concept unspecialized = requires { typename P::hybridrl_unspecialized; };
}  // namespace detail

// ---- which axis a type belongs to (by pattern, without instantiating the policy) ----

template <class T> inline constexpr bool is_algorithm_v = false;
template <class Tag> inline constexpr bool is_algorithm_v<Algorithm<Tag>> = true;
template <class T> inline constexpr bool is_sharding_v = false;
template <class Tag> inline constexpr bool is_sharding_v<Sharding<Tag>> = true;
template <class T> inline constexpr bool is_rollout_v = false;
template <class Tag> inline constexpr bool is_rollout_v<Rollout<Tag>> = true;
template <class T> inline constexpr bool is_loader_v = false;
template <class Tag> inline constexpr bool is_loader_v<Loader<Tag>> = true;

}  // namespace hybridrl
