#pragma once
/// \file
/// A sharded state: what one rank holds of a model's and optimizer's full tensors, without
/// gathering them (PyTorch DCP's idea, in our layout). Every full tensor is addressed as its
/// flattened (row-major) elements; a rank's `ShardedState` holds contiguous ranges of them
/// ("pieces", each a 1-D tensor that starts at a flat element offset), the full shapes of every
/// key, and the small tensors every rank holds alike ("whole": step counts). A `StateSource` reads
/// any flat range of any key back — from a StateDict in memory or from the files of a sharded
/// checkpoint (trainer/checkpoint.hpp) — so a state written by S ranks loads on any number of
/// ranks: each reads the ranges its own slices cover, and nothing else.

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/sharding/concepts.hpp"

namespace hybridrl {

/// One rank's part of a state (see the file comment).
struct ShardedState {
  /// The full shape of every key this state has pieces of (the same map on every rank).
  std::map<std::string, std::vector<int64_t>> shapes;
  /// This rank's pieces: (key, flat start) → 1-D tensor of the elements from there on.
  std::map<std::pair<std::string, int64_t>, at::Tensor> pieces;
  /// Tensors every rank holds alike (scalars, counts): one rank writes them.
  StateDict whole;

  /// Adds `prefix` to every key (a critic's state under "critic.").
  void prefix(const std::string& p) {
    std::map<std::string, std::vector<int64_t>> s;
    for (auto& [k, v] : shapes) s.emplace(p + k, std::move(v));
    shapes = std::move(s);
    std::map<std::pair<std::string, int64_t>, at::Tensor> q;
    for (auto& [k, v] : pieces) q.emplace(std::pair(p + k.first, k.second), std::move(v));
    pieces = std::move(q);
    StateDict w;
    for (auto& [k, v] : whole) w.emplace(p + k, std::move(v));
    whole = std::move(w);
  }
  /// Adds another state's keys (the critic's beside the policy's).
  void merge(ShardedState other) {
    for (auto& [k, v] : other.shapes) shapes.insert_or_assign(k, std::move(v));
    for (auto& [k, v] : other.pieces) pieces.insert_or_assign(k, std::move(v));
    for (auto& [k, v] : other.whole) whole.insert_or_assign(k, std::move(v));
  }
};

/// Read access to a state's tensors by key: whole, or a flat range of one.
class StateSource {
 public:
  virtual ~StateSource() = default;
  /// The full shape of `key`, or nullopt when the state has no such key.
  [[nodiscard]] virtual std::optional<std::vector<int64_t>> shape(const std::string& key) const = 0;
  /// Elements [start, start + n) of `key` flattened: a 1-D CPU tensor (n ≥ 1, the range inside).
  [[nodiscard]] virtual at::Tensor read(const std::string& key, int64_t start, int64_t n) const = 0;
  /// Every key.
  [[nodiscard]] virtual std::vector<std::string> keys() const = 0;
  /// Where the state lives (for errors).
  [[nodiscard]] virtual std::string where() const = 0;

  /// Whether the state has `key`.
  [[nodiscard]] bool contains(const std::string& key) const { return shape(key).has_value(); }
  /// The whole tensor `key` in its shape; an absent key is an Error naming it and `fix`.
  [[nodiscard]] at::Tensor full(const std::string& key, const std::string& fix = "load a state written for the same model") const {
    const auto s = shape(key);
    HYBRIDRL_CHECK(s.has_value(), fmt::format("{} has no '{}'", where(), key), fix);
    int64_t n = 1;
    for (auto d : *s) n *= d;
    if (n == 0) return at::empty(*s);
    return read(key, 0, n).view(*s);
  }
  /// The keys under `prefix`, each read whole, the prefix dropped.
  [[nodiscard]] StateDict materialize(const std::string& prefix = "") const {
    StateDict out;
    for (const auto& k : keys()) {
      if (k.rfind(prefix, 0) == 0) out.emplace(k.substr(prefix.size()), full(k));
    }
    return out;
  }
};

/// A StateSource over a StateDict in memory (one-process states, and tests).
class StateDictSource final : public StateSource {
 public:
  explicit StateDictSource(const StateDict& s, std::string prefix = "") : s_(&s), prefix_(std::move(prefix)) {}
  [[nodiscard]] std::optional<std::vector<int64_t>> shape(const std::string& key) const override {
    auto it = s_->find(prefix_ + key);
    if (it == s_->end()) return std::nullopt;
    return it->second.sizes().vec();
  }
  [[nodiscard]] at::Tensor read(const std::string& key, int64_t start, int64_t n) const override {
    const auto& t = s_->at(prefix_ + key);
    return t.detach().reshape({-1}).narrow(0, start, n).cpu();
  }
  [[nodiscard]] std::vector<std::string> keys() const override {
    std::vector<std::string> out;
    for (const auto& [k, v] : *s_) {
      if (k.rfind(prefix_, 0) == 0) out.push_back(k.substr(prefix_.size()));
    }
    return out;
  }
  [[nodiscard]] std::string where() const override { return "the state"; }

 private:
  const StateDict* s_;
  std::string prefix_;
};

/// A view of another StateSource whose keys are those under `prefix` (the prefix dropped).
class PrefixedSource final : public StateSource {
 public:
  PrefixedSource(const StateSource& inner, std::string prefix) : inner_(&inner), prefix_(std::move(prefix)) {}
  [[nodiscard]] std::optional<std::vector<int64_t>> shape(const std::string& key) const override {
    return inner_->shape(prefix_ + key);
  }
  [[nodiscard]] at::Tensor read(const std::string& key, int64_t start, int64_t n) const override {
    return inner_->read(prefix_ + key, start, n);
  }
  [[nodiscard]] std::vector<std::string> keys() const override {
    std::vector<std::string> out;
    for (const auto& k : inner_->keys()) {
      if (k.rfind(prefix_, 0) == 0) out.push_back(k.substr(prefix_.size()));
    }
    return out;
  }
  [[nodiscard]] std::string where() const override { return inner_->where(); }

 private:
  const StateSource* inner_;
  std::string prefix_;
};

namespace detail {

/// Checks that `key` exists in `src` with shape `want`; throws Error naming `what`, the key and
/// both shapes otherwise.
inline void check_state_shape(const StateSource& src, const std::string& key, const std::vector<int64_t>& want,
                              const char* what) {
  const auto s = src.shape(key);
  HYBRIDRL_CHECK(s.has_value(), fmt::format("{}: {} has no '{}'", what, src.where(), key),
                 "load a checkpoint of a model with the same config");
  HYBRIDRL_CHECK(*s == want,
                 fmt::format("{}: '{}' has shape [{}] in {}, the model [{}]", what, key, fmt::join(*s, ", "),
                             src.where(), fmt::join(want, ", ")),
                 "load a checkpoint of a model with the same config");
}

}  // namespace detail

}  // namespace hybridrl
