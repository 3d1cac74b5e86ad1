#pragma once
/// \file
/// The weight hand-off between a sharded model and a rollout engine: named tensors in buckets, cut
/// to the shard a `WeightSpec` asks for. `tensor_parallel_dim` is THE tensor-parallel rule of the
/// Llama-family model by Hugging Face parameter name; the tensor-parallel layers of model/ and the
/// rollout engines agree with it, so a shard exported here is the shard a TP rank holds.

#include <ATen/core/Tensor.h>
#include <fmt/format.h>
#include <torch/ordered_dict.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/sharding/weight_spec.hpp"

namespace hybridrl {

/// One tensor with its Hugging Face name ("model.layers.0.self_attn.q_proj.weight").
struct NamedTensor {
  std::string name;  ///< Hugging Face parameter name
  at::Tensor tensor;  ///< the (shard of the) tensor
};

/// A bucket of named tensors: the unit in which weights travel from a sharded model to a rollout
/// engine, so no second full copy of the weights ever exists at once.
using WeightBucket = std::vector<NamedTensor>;

/// Receives the buckets of an export one at a time (a rollout engine's `load_weights`).
using WeightSink = std::function<void(const WeightBucket&)>;

namespace detail {
/// True when `name` ends with `suffix`.
inline bool ends_with(std::string_view name, std::string_view suffix) noexcept {
  return name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix;
}
}  // namespace detail

/// The dimension along which tensor parallelism splits the parameter `hf_name`, or std::nullopt
/// when every rank holds it whole. The one rule (Megatron's layout):
/// - column-parallel: `q_proj`, `k_proj`, `v_proj`, `gate_proj`, `up_proj` weights and the q/k/v
///   biases split on dim 0 (output features);
/// - row-parallel: `o_proj`, `down_proj` weights split on dim 1 (input features); their biases,
///   added after the all-reduce, are replicated;
/// - `embed_tokens` and `lm_head` split on dim 0 (the vocabulary);
/// - norms (`input_layernorm`, `post_attention_layernorm`, the final `norm`) are replicated.
/// Any other name throws hybridrl::Error, so a new layer cannot be silently replicated.
[[nodiscard]] inline std::optional<int64_t> tensor_parallel_dim(std::string_view hf_name) {
  using detail::ends_with;
  for (std::string_view column : {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"}) {
    const std::string w = fmt::format("{}.weight", column);
    const std::string b = fmt::format("{}.bias", column);
    if (ends_with(hf_name, w) || ends_with(hf_name, b)) return 0;
  }
  for (std::string_view row : {"o_proj", "down_proj"}) {
    if (ends_with(hf_name, fmt::format("{}.weight", row))) return 1;
    if (ends_with(hf_name, fmt::format("{}.bias", row))) return std::nullopt;
  }
  if (ends_with(hf_name, "embed_tokens.weight") || ends_with(hf_name, "lm_head.weight")) return 0;
  if (ends_with(hf_name, "layernorm.weight") || ends_with(hf_name, "norm.weight")) return std::nullopt;
  // The critic's value head ([1, hidden]) is replicated: every rank holds it whole.
  if (ends_with(hf_name, "score.weight") || ends_with(hf_name, "score.bias")) return std::nullopt;
  throw Error(fmt::format("tensor_parallel_dim: no tensor-parallel rule for the parameter '{}'", hf_name),
              "name it as the Llama family does (q/k/v/o_proj, gate/up/down_proj, embed_tokens, lm_head, "
              "*norm), or add its rule to sharding/weights.hpp together with its parallel layer");
}

/// The shard of `tensor` (named `hf_name`) that rank `spec.tp_rank` of `spec.tp_size` holds,
/// detached, contiguous and converted to `spec.dtype` when given. Throws when the split dimension
/// does not divide by tp_size.
[[nodiscard]] inline at::Tensor export_shard(std::string_view hf_name, const at::Tensor& tensor,
                                             const WeightSpec& spec) {
  at::Tensor out = tensor.detach();
  if (spec.tp_size > 1) {
    if (const auto dim = tensor_parallel_dim(hf_name)) {
      HYBRIDRL_CHECK(*dim < out.dim(),
                     fmt::format("export_weights: '{}' has {} dimension(s), its rule splits dim {}", hf_name,
                                 out.dim(), *dim),
                     "pass the parameter tensor itself, in its Hugging Face shape");
      const int64_t size = out.size(*dim);
      HYBRIDRL_CHECK(size % spec.tp_size == 0,
                     fmt::format("export_weights: '{}' has size {} on dim {}, which does not split over "
                                 "tp_size {} ({} % {} = {})",
                                 hf_name, size, *dim, spec.tp_size, size, spec.tp_size, size % spec.tp_size),
                     "choose a tensor-parallel size that divides the heads, the intermediate size and "
                     "the vocabulary (pad the vocabulary to a multiple of tp_size)");
      const int64_t part = size / spec.tp_size;
      out = out.narrow(*dim, spec.tp_rank * part, part);
    }
  }
  if (spec.dtype && out.scalar_type() != *spec.dtype) out = out.to(*spec.dtype);
  return out.contiguous();
}

/// The shard of every tensor of `named` for `spec`, in the input order (see export_shard).
[[nodiscard]] inline std::vector<NamedTensor> export_weights(const std::vector<NamedTensor>& named,
                                                             const WeightSpec& spec) {
  spec.validate();
  std::vector<NamedTensor> out;
  out.reserve(named.size());
  for (const auto& t : named) out.push_back({t.name, export_shard(t.name, t.tensor, spec)});
  return out;
}

/// The same for `module.named_parameters()` / `named_buffers()` (a torch::OrderedDict).
[[nodiscard]] inline std::vector<NamedTensor> export_weights(
    const torch::OrderedDict<std::string, at::Tensor>& named, const WeightSpec& spec) {
  spec.validate();
  std::vector<NamedTensor> out;
  out.reserve(named.size());
  for (const auto& item : named) out.push_back({item.key(), export_shard(item.key(), item.value(), spec)});
  return out;
}

/// Collects exported tensors into buckets of about `bucket_bytes` for a sink: a bucket goes to the
/// sink when the next tensor would overflow it or it is full (a tensor larger than that travels
/// alone), so at most one bucket exists at a time. finish() sends the last and counts them.
class WeightBucketer {
 public:
  WeightBucketer(int64_t bucket_bytes, const WeightSink& sink) : bucket_bytes_(bucket_bytes), sink_(sink) {
    HYBRIDRL_CHECK(bucket_bytes >= 1, fmt::format("export_weights: bucket_bytes = {} is below 1", bucket_bytes),
                   "use a bucket size such as 512 MiB (512 << 20)");
    HYBRIDRL_CHECK(static_cast<bool>(sink), "export_weights: no sink given",
                   "pass the rollout engine's load_weights, e.g. [&](const WeightBucket& b) { engine.load_weights(b); }");
  }
  void add(std::string name, at::Tensor t) {
    const auto size = static_cast<int64_t>(t.numel() * t.element_size());
    if (bytes_ > 0 && bytes_ + size > bucket_bytes_) flush();
    bucket_.push_back({std::move(name), std::move(t)});
    bytes_ += size;
    if (bytes_ >= bucket_bytes_) flush();
  }
  int64_t finish() {
    flush();
    return buckets_;
  }

 private:
  void flush() {
    if (bucket_.empty()) return;
    sink_(bucket_);
    bucket_.clear();
    bytes_ = 0;
    ++buckets_;
  }
  int64_t bucket_bytes_;
  const WeightSink& sink_;
  WeightBucket bucket_;
  int64_t bytes_ = 0, buckets_ = 0;
};

/// Exports `named` for `spec` bucket by bucket: shards are cut one tensor at a time and handed to
/// `sink` whenever a bucket reaches `bucket_bytes` (a tensor larger than that travels alone), so at
/// most one bucket of exported shards exists at a time. Returns the number of buckets.
inline int64_t export_weights(const torch::OrderedDict<std::string, at::Tensor>& named, const WeightSpec& spec,
                              int64_t bucket_bytes, const WeightSink& sink) {
  spec.validate();
  WeightBucketer out(bucket_bytes, sink);
  for (const auto& item : named) out.add(item.key(), export_shard(item.key(), item.value(), spec));
  return out.finish();
}

}  // namespace hybridrl
