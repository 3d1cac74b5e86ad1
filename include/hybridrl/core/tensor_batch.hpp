#pragma once
/// \file
/// TensorBatch — verl's DataProto in C++: named tensors sharing a leading batch dimension, plus
/// per-sample non-tensor columns (JSON values: text, ids) and batch-level metadata.
///
/// Tensors are shared, not copied (operations return views or new tensors, never mutate inputs),
/// so a TensorBatch is cheap to pass by value. Every operation checks its arguments and throws
/// hybridrl::Error naming the problem and the fix.

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/core/keys.hpp"
#include "hybridrl/core/options.hpp"
#include "hybridrl/io/json.hpp"

namespace hybridrl {

/// One per-sample non-tensor value (a prompt string, a uid, a data source name, a number...).
using Value = nlohmann::json;
/// A per-sample non-tensor column: one Value per sample.
using Column = std::vector<Value>;

class TensorBatch;

/// Result of TensorBatch::pad_to_divisor: the padded batch and how many rows were appended.
struct PaddedBatch;

/// Where padding goes in a padded row.
enum class PaddingSide { left, right };
HYBRIDRL_ENUM_NAMES(PaddingSide, left, right);

/// How TensorBatch::concat pads token tensors of different widths to one width: 2-D tensors whose
/// dim 1 differs between parts are padded on `side` with `values[key]` (0 for a key not listed).
/// A loader returns the padding of its batches (BatchLoader::padding()).
struct ConcatPadding {
  PaddingSide side = PaddingSide::right;  ///< left for prompt batches, right for full sequences
  std::map<std::string, int64_t> values;  ///< pad value per key, e.g. {"input_ids", pad_id}
};

namespace detail {
/// The producer named in a missing-key error: the Key's own, or keys::find's for a plain string.
inline std::string producer_of(std::string_view name) {
  const Key* k = keys::find(name);
  return k == nullptr ? std::string("not a cross-axis key (core/keys.hpp)") : std::string(k->producer);
}
}  // namespace detail

/// Named tensors with a common leading (batch) dimension, non-tensor columns and metadata.
class TensorBatch {
 public:
  TensorBatch() = default;

  /// Builds a batch; every tensor and column must agree on the leading dimension.
  explicit TensorBatch(std::map<std::string, at::Tensor> tensors,
                       std::map<std::string, Column> columns = {},
                       nlohmann::json meta = nlohmann::json::object()) {
    for (auto& [k, t] : tensors) set(k, std::move(t));
    for (auto& [k, c] : columns) set_column(k, std::move(c));
    set_meta(std::move(meta));
  }

  // ---- size and access -------------------------------------------------------------------------

  /// Number of samples (the shared leading dimension); 0 for a batch with no entries.
  [[nodiscard]] int64_t size() const noexcept { return size_.value_or(0); }
  /// True when the batch holds no tensors and no columns.
  [[nodiscard]] bool empty() const noexcept { return tensors_.empty() && columns_.empty(); }

  [[nodiscard]] bool has_tensor(const std::string& key) const { return tensors_.count(key) != 0; }
  [[nodiscard]] bool has_column(const std::string& key) const { return columns_.count(key) != 0; }

  /// True when `key` is stored as a tensor or as a column.
  [[nodiscard]] bool has(std::string_view key) const {
    const std::string k(key);
    return has_tensor(k) || has_column(k);
  }

  /// The tensor stored under `key`; throws naming the key's producer (core/keys.hpp) and the
  /// tensors that exist when it is missing.
  [[nodiscard]] const at::Tensor& tensor(const std::string& key) const {
    auto it = tensors_.find(key);
    if (it == tensors_.end()) throw_no_tensor(key, detail::producer_of(key));  // looked up only then
    return it->second;
  }
  /// The tensor stored under a cross-axis key; a missing key's error names its producer.
  [[nodiscard]] const at::Tensor& tensor(const Key& key) const {
    auto it = tensors_.find(key.str());
    if (it == tensors_.end()) throw_no_tensor(key.str(), std::string(key.producer));
    return it->second;
  }

  /// The non-tensor column stored under `key`; throws naming the producer and the columns that
  /// exist when it is missing.
  [[nodiscard]] const Column& column(const std::string& key) const {
    auto it = columns_.find(key);
    if (it == columns_.end()) throw_no_column(key, detail::producer_of(key));
    return it->second;
  }
  /// The column stored under a cross-axis key; a missing key's error names its producer.
  [[nodiscard]] const Column& column(const Key& key) const {
    auto it = columns_.find(key.str());
    if (it == columns_.end()) throw_no_column(key.str(), std::string(key.producer));
    return it->second;
  }

  /// Checks at a phase boundary that every key is present (as a tensor or a column). Throws once,
  /// listing each missing key with its producer and the stage that needs it, so a pipeline fails
  /// before the expensive phases instead of at the first read.
  void require(std::span<const Key> needed, std::string_view stage) const {
    std::vector<std::string> missing;
    for (const auto& k : needed) {
      if (!has(k.name)) missing.push_back(fmt::format("'{}' {} {} (produced by {})", k.name, k.shape, k.dtype, k.producer));
    }
    throw_missing(missing, stage);
  }
  /// require() for a braced list: `batch.require({keys::advantages, keys::response_mask}, "update")`.
  void require(std::initializer_list<Key> needed, std::string_view stage) const {
    require(std::span<const Key>(needed.begin(), needed.size()), stage);
  }
  /// require() for plain key names; the producer comes from keys::find.
  void require(std::span<const std::string_view> needed, std::string_view stage) const {
    std::vector<std::string> missing;
    for (const auto& k : needed) {
      if (!has(k)) missing.push_back(fmt::format("'{}' (produced by {})", k, detail::producer_of(k)));
    }
    throw_missing(missing, stage);
  }

  /// Stores (or replaces) a tensor; its dim 0 must equal size() unless the batch is empty.
  TensorBatch& set(const std::string& key, at::Tensor t) {
    HYBRIDRL_CHECK(t.defined(), fmt::format("tensor '{}' is undefined", key),
                   "pass a defined tensor (e.g. at::zeros({batch, ...}))");
    HYBRIDRL_CHECK(t.dim() >= 1,
                   fmt::format("tensor '{}' is a 0-d scalar; a batch entry needs a leading batch "
                               "dimension",
                               key),
                   "store per-batch scalars in meta(), or unsqueeze(0) a per-sample value");
    check_rows(key, t.size(0));
    tensors_.insert_or_assign(key, std::move(t));
    return *this;
  }

  /// Stores (or replaces) a non-tensor column; its length must equal size() unless empty.
  TensorBatch& set_column(const std::string& key, Column c) {
    check_rows(key, static_cast<int64_t>(c.size()));
    columns_.insert_or_assign(key, std::move(c));
    return *this;
  }

  /// Removes a tensor or column (no error when absent). The size is forgotten once empty.
  TensorBatch& erase(const std::string& key) {
    tensors_.erase(key);
    columns_.erase(key);
    if (empty()) size_.reset();
    return *this;
  }

  /// Batch-level metadata (a JSON object): step numbers, temperatures, global token counts...
  [[nodiscard]] const nlohmann::json& meta() const noexcept { return meta_; }
  /// Replaces the metadata; it must be a JSON object.
  TensorBatch& set_meta(nlohmann::json meta) {
    HYBRIDRL_CHECK(meta.is_object(),
                   fmt::format("TensorBatch metadata must be a JSON object, got {}", meta.type_name()),
                   "pass nlohmann::json::object() or {{\"key\", value}} pairs");
    meta_ = std::move(meta);
    return *this;
  }
  /// Sets one metadata entry.
  TensorBatch& set_meta(const std::string& key, nlohmann::json value) {
    meta_[key] = std::move(value);
    return *this;
  }

  [[nodiscard]] std::vector<std::string> tensor_keys() const { return keys_of(tensors_); }
  [[nodiscard]] std::vector<std::string> column_keys() const { return keys_of(columns_); }
  [[nodiscard]] const std::map<std::string, at::Tensor>& tensors() const noexcept { return tensors_; }
  [[nodiscard]] const std::map<std::string, Column>& columns() const noexcept { return columns_; }

  // ---- operations --------------------------------------------------------------------------------

  /// A batch with only the named tensors and columns (shared, not copied); metadata is kept.
  [[nodiscard]] TensorBatch select(const std::vector<std::string>& tensor_keys,
                                   const std::vector<std::string>& column_keys = {}) const {
    TensorBatch out;
    for (const auto& k : tensor_keys) out.set(k, tensor(k));
    for (const auto& k : column_keys) out.set_column(k, column(k));
    if (out.empty()) out.size_ = size_;
    out.meta_ = meta_;
    return out;
  }

  /// Merges `other` into this batch. Sizes must match; a key present in both must hold equal
  /// values (same tensor contents, same column values, same metadata), otherwise it throws.
  TensorBatch& union_with(const TensorBatch& other) {
    if (!empty() && !other.empty()) {
      HYBRIDRL_CHECK(size() == other.size(),
                     fmt::format("union_with: batch sizes differ ({} vs {})", size(), other.size()),
                     "union only batches that describe the same samples; select or slice first");
    }
    for (const auto& [k, t] : other.tensors_) {
      if (auto it = tensors_.find(k); it != tensors_.end()) {
        HYBRIDRL_CHECK(same_tensor(it->second, t),
                       fmt::format("union_with: tensor '{}' exists in both batches with different "
                                   "values",
                                   k),
                       "rename one of them, or erase() it from one side before the union");
      }
    }
    for (const auto& [k, c] : other.columns_) {
      if (auto it = columns_.find(k); it != columns_.end()) {
        HYBRIDRL_CHECK(it->second == c,
                       fmt::format("union_with: column '{}' exists in both batches with different "
                                   "values",
                                   k),
                       "rename one of them, or erase() it from one side before the union");
      }
    }
    for (const auto& [k, v] : other.meta_.items()) {
      if (meta_.contains(k)) {
        HYBRIDRL_CHECK(meta_[k] == v,
                       fmt::format("union_with: metadata '{}' differs ({} vs {})", k,
                                   io::brief(meta_[k]), io::brief(v)),
                       "make the metadata agree, or set_meta() one side before the union");
      }
    }
    for (const auto& [k, t] : other.tensors_) set(k, t);
    for (const auto& [k, c] : other.columns_) set_column(k, c);
    for (const auto& [k, v] : other.meta_.items()) meta_[k] = v;
    if (empty() && other.size_) size_ = other.size_;
    return *this;
  }

  /// Rows [start, end) with `step` (views of the tensors). Negative or out-of-range bounds throw.
  [[nodiscard]] TensorBatch slice(int64_t start, int64_t end, int64_t step = 1) const {
    HYBRIDRL_CHECK(step >= 1, fmt::format("slice: step must be >= 1, got {}", step),
                   "use reorder() with an index tensor for reversed or arbitrary orders");
    HYBRIDRL_CHECK(0 <= start && start <= end && end <= size(),
                   fmt::format("slice: [{}, {}) is outside a batch of {} samples", start, end, size()),
                   fmt::format("use 0 <= start <= end <= {}", size()));
    TensorBatch out;
    out.meta_ = meta_;
    out.size_ = (end - start + step - 1) / step;
    for (const auto& [k, t] : tensors_) out.tensors_.emplace(k, t.slice(0, start, end, step));
    for (const auto& [k, c] : columns_) {
      Column part;
      for (int64_t i = start; i < end; i += step) part.push_back(c[static_cast<size_t>(i)]);
      out.columns_.emplace(k, std::move(part));
    }
    return out;
  }

  /// Splits into `n` equal chunks (verl's chunk). size() must be divisible by n.
  [[nodiscard]] std::vector<TensorBatch> chunk(int64_t n) const {
    HYBRIDRL_CHECK(n >= 1, fmt::format("chunk: number of chunks must be >= 1, got {}", n),
                   "pass the number of ranks or micro-batches, at least 1");
    HYBRIDRL_CHECK(size() % n == 0,
                   fmt::format("chunk: {} samples do not split into {} equal chunks ({} % {} = {})",
                               size(), n, size(), n, size() % n),
                   fmt::format("pad first with pad_to_divisor({}) and unpad() the result, or use "
                               "split() for unequal parts",
                               n));
    return split(size() / n, n);
  }

  /// Splits into consecutive parts of `part_size` samples; the last part may be smaller.
  [[nodiscard]] std::vector<TensorBatch> split(int64_t part_size) const {
    HYBRIDRL_CHECK(part_size >= 1, fmt::format("split: part size must be >= 1, got {}", part_size),
                   "pass the number of samples each part should hold");
    return split(part_size, (size() + part_size - 1) / part_size);
  }

  /// Concatenates batches with identical tensor keys, column keys and compatible metadata; with
  /// `padding`, 2-D tensors of different widths (token tensors of two loader batches) are first
  /// padded to the widest on padding->side with padding->values[key].
  [[nodiscard]] static TensorBatch concat(const std::vector<TensorBatch>& parts,
                                          const std::optional<ConcatPadding>& padding = std::nullopt) {
    HYBRIDRL_CHECK(!parts.empty(), "concat: no batches given", "pass at least one TensorBatch");
    const auto& first = parts.front();
    TensorBatch out;
    out.meta_ = nlohmann::json::object();
    for (size_t i = 0; i < parts.size(); ++i) {
      HYBRIDRL_CHECK(parts[i].tensor_keys() == first.tensor_keys() &&
                         parts[i].column_keys() == first.column_keys(),
                     fmt::format("concat: part {} has keys [{}] / columns [{}] but part 0 has [{}] / "
                                 "[{}]",
                                 i, fmt::join(parts[i].tensor_keys(), ", "),
                                 fmt::join(parts[i].column_keys(), ", "),
                                 fmt::join(first.tensor_keys(), ", "),
                                 fmt::join(first.column_keys(), ", ")),
                     "select() the same keys from every part before concatenating");
      for (const auto& [k, v] : parts[i].meta_.items()) {
        HYBRIDRL_CHECK(!out.meta_.contains(k) || out.meta_[k] == v,
                       fmt::format("concat: metadata '{}' differs between parts ({} vs {})", k,
                                   out.meta_.contains(k) ? io::brief(out.meta_[k]) : "", io::brief(v)),
                       "make the metadata agree, or set_meta() the parts before concatenating");
        out.meta_[k] = v;
      }
    }
    int64_t total = 0;
    for (const auto& p : parts) total += p.size();
    out.size_ = total;
    for (const auto& k : first.tensor_keys()) {
      std::vector<at::Tensor> ts;
      ts.reserve(parts.size());
      for (const auto& p : parts) ts.push_back(p.tensors_.at(k));
      if (padding) pad_widths(k, ts, *padding);
      for (size_t i = 1; i < ts.size(); ++i) {
        HYBRIDRL_CHECK(ts[i].sizes().slice(1) == ts[0].sizes().slice(1) &&
                           ts[i].scalar_type() == ts[0].scalar_type() &&
                           ts[i].device() == ts[0].device(),
                       fmt::format("concat: tensor '{}' of part {} is {} {} on {}, part 0's is {} {} "
                                   "on {}",
                                   k, i, shape_str(ts[i]), c10::toString(ts[i].scalar_type()),
                                   ts[i].device().str(), shape_str(ts[0]),
                                   c10::toString(ts[0].scalar_type()), ts[0].device().str()),
                       "pad to a common length, cast to one dtype and move to one device first");
      }
      out.tensors_.emplace(k, at::cat(ts, 0));
    }
    for (const auto& k : first.column_keys()) {
      Column all;
      all.reserve(static_cast<size_t>(total));
      for (const auto& p : parts) {
        const auto& c = p.columns_.at(k);
        all.insert(all.end(), c.begin(), c.end());
      }
      out.columns_.emplace(k, std::move(all));
    }
    return out;
  }

  /// Repeats every sample `n` times: interleaved (a a b b) or tiled (a b a b).
  /// GRPO uses the interleaved form so the n samples of one prompt sit together.
  [[nodiscard]] TensorBatch repeat(int64_t n, bool interleave = true) const {
    HYBRIDRL_CHECK(n >= 1, fmt::format("repeat: n must be >= 1, got {}", n),
                   "pass the number of samples per prompt (rollout.n), at least 1");
    const int64_t b = size();
    auto idx = interleave ? at::arange(b, at::kLong).repeat_interleave(n)
                          : at::arange(b, at::kLong).repeat({n});
    return reorder(idx);
  }

  /// Rows in the order given by `indices` (int64, 1-D, values in [0, size())). Indices may
  /// repeat or omit rows, so this also gathers.
  [[nodiscard]] TensorBatch reorder(const at::Tensor& indices) const {
    HYBRIDRL_CHECK(indices.defined() && indices.dim() == 1 &&
                       (indices.scalar_type() == at::kLong || indices.scalar_type() == at::kInt),
                   "reorder: indices must be a 1-D int64 tensor",
                   "build them with at::arange / at::argsort (dtype at::kLong)");
    auto cpu_idx = indices.to(at::kCPU, at::kLong).contiguous();
    const int64_t n = cpu_idx.numel();
    if (n > 0) {
      const auto* q = cpu_idx.data_ptr<int64_t>();
      const auto [lo_it, hi_it] = std::minmax_element(q, q + n);
      const int64_t lo = *lo_it, hi = *hi_it;
      HYBRIDRL_CHECK(lo >= 0 && hi < size(),
                     fmt::format("reorder: index range [{}, {}] is outside a batch of {} samples", lo,
                                 hi, size()),
                     fmt::format("use indices in [0, {})", size()));
    }
    TensorBatch out;
    out.meta_ = meta_;
    out.size_ = n;
    std::optional<at::Tensor> device_idx;  // copied to the device once, not once per tensor
    for (const auto& [k, t] : tensors_) {
      if (t.device().is_cpu()) {
        out.tensors_.emplace(k, t.index_select(0, cpu_idx));
        continue;
      }
      if (!device_idx || device_idx->device() != t.device()) device_idx = cpu_idx.to(t.device());
      out.tensors_.emplace(k, t.index_select(0, *device_idx));
    }
    const auto* p = cpu_idx.data_ptr<int64_t>();
    for (const auto& [k, c] : columns_) {
      Column part;
      part.reserve(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) part.push_back(c[static_cast<size_t>(p[i])]);
      out.columns_.emplace(k, std::move(part));
    }
    return out;
  }

  /// Moves every tensor to `device` (columns and metadata are host data and stay as they are).
  [[nodiscard]] TensorBatch to(const at::Device& device, bool non_blocking = false) const {
    TensorBatch out = *this;
    for (auto& [k, t] : out.tensors_) t = t.to(device, non_blocking);
    return out;
  }

  /// Appends rows so that size() becomes a multiple of `divisor` (verl pads with copies of the
  /// first rows, cycling when more are needed). Returns the padded batch and the pad count.
  [[nodiscard]] PaddedBatch pad_to_divisor(int64_t divisor) const;

  /// Removes the last `pad_size` rows (the inverse of pad_to_divisor on a processed batch).
  [[nodiscard]] TensorBatch unpad(int64_t pad_size) const {
    HYBRIDRL_CHECK(pad_size >= 0 && pad_size <= size(),
                   fmt::format("unpad: cannot remove {} rows from a batch of {}", pad_size, size()),
                   "pass the pad_size that pad_to_divisor returned for this batch");
    return slice(0, size() - pad_size);
  }

 private:
  template <class M>
  static std::vector<std::string> keys_of(const M& m) {
    std::vector<std::string> ks;
    ks.reserve(m.size());
    for (const auto& kv : m) ks.push_back(kv.first);
    return ks;
  }

  [[noreturn]] void throw_no_tensor(const std::string& key, const std::string& producer) const {
    throw Error(fmt::format("TensorBatch has no tensor '{}' (produced by {}; tensors: [{}])", key,
                            producer, fmt::join(tensor_keys(), ", ")),
                "run the component that produces it earlier in the pipeline, or check the key's "
                "spelling (core/keys.hpp)");
  }

  [[noreturn]] void throw_no_column(const std::string& key, const std::string& producer) const {
    throw Error(fmt::format("TensorBatch has no column '{}' (produced by {}; columns: [{}])", key,
                            producer, fmt::join(column_keys(), ", ")),
                "run the component that produces it earlier in the pipeline, or check the key's "
                "spelling (core/keys.hpp)");
  }

  void throw_missing(const std::vector<std::string>& missing, std::string_view stage) const {
    HYBRIDRL_CHECK(missing.empty(),
                   fmt::format("stage '{}' needs {} key(s) the batch lacks: {} (the batch has tensors "
                               "[{}], columns [{}])",
                               stage, missing.size(), fmt::join(missing, "; "),
                               fmt::join(tensor_keys(), ", "), fmt::join(column_keys(), ", ")),
                   "run each named producer before this stage, or check the key's spelling "
                   "against core/keys.hpp");
  }

  // Pads the 2-D tensors of `ts` to the widest dim 1 (only when widths differ).
  static void pad_widths(const std::string& key, std::vector<at::Tensor>& ts, const ConcatPadding& p) {
    int64_t widest = 0;
    bool differ = false;
    for (const auto& t : ts) {
      if (t.dim() != 2) return;
      if (widest != 0 && t.size(1) != widest) differ = true;
      widest = std::max(widest, t.size(1));
    }
    if (!differ) return;
    const auto it = p.values.find(key);
    const int64_t value = it == p.values.end() ? 0 : it->second;
    for (auto& t : ts) {
      const int64_t extra = widest - t.size(1);
      if (extra == 0) continue;
      auto fill = at::full({t.size(0), extra}, value, t.options());
      t = p.side == PaddingSide::left ? at::cat({fill, t}, 1) : at::cat({t, fill}, 1);
    }
  }

  static std::string shape_str(const at::Tensor& t) {
    return fmt::format("[{}]", fmt::join(t.sizes().vec(), ", "));
  }

  static bool same_tensor(const at::Tensor& a, const at::Tensor& b) {
    if (a.is_same(b)) return true;
    return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
           a.device() == b.device() && a.equal(b);
  }

  void check_rows(const std::string& key, int64_t rows) {
    if (!empty() && size_) {
      HYBRIDRL_CHECK(rows == *size_,
                     fmt::format("entry '{}' has {} rows but the batch has {} samples", key, rows,
                                 *size_),
                     "every tensor's dim 0 and every column's length must equal the batch size");
    }
    if (empty()) size_ = rows;
  }

  // `count` parts of `part_size` rows each (the last one possibly shorter or empty).
  [[nodiscard]] std::vector<TensorBatch> split(int64_t part_size, int64_t count) const {
    std::vector<TensorBatch> parts;
    parts.reserve(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      const int64_t lo = std::min(i * part_size, size());
      const int64_t hi = std::min(lo + part_size, size());
      parts.push_back(slice(lo, hi));
    }
    return parts;
  }

  std::map<std::string, at::Tensor> tensors_;
  std::map<std::string, Column> columns_;
  nlohmann::json meta_ = nlohmann::json::object();
  std::optional<int64_t> size_;
};

struct PaddedBatch {
  TensorBatch batch;     ///< the padded batch, size() % divisor == 0
  int64_t pad_size = 0;  ///< rows appended; pass to unpad()
};

inline PaddedBatch TensorBatch::pad_to_divisor(int64_t divisor) const {
  HYBRIDRL_CHECK(divisor >= 1, fmt::format("pad_to_divisor: divisor must be >= 1, got {}", divisor),
                 "pass the number of ranks or micro-batches the batch must split into");
  const int64_t rem = size() % divisor;
  if (rem == 0) return {*this, 0};
  HYBRIDRL_CHECK(size() > 0, "pad_to_divisor: cannot pad an empty batch (no rows to copy)",
                 "skip empty batches before padding");
  const int64_t pad = divisor - rem;
  auto idx = at::cat({at::arange(size(), at::kLong), at::arange(pad, at::kLong).remainder(size())});
  return {reorder(idx), pad};
}

}  // namespace hybridrl
