#pragma once
// Test support for the sharding engines (Sharding<FSDP>, Sharding<TP3D>): the fixture model, eight
// rows of varied lengths, a rank's loss over its share, three steps of two micro-batches, the
// exported weights by name, and a relative distance.
#include <hybridrl/model/pretrained.hpp>
#include <hybridrl/core/keys.hpp>
#include <hybridrl/core/tensor_batch.hpp>
#include <hybridrl/distributed/communicator.hpp>
#include <hybridrl/sharding/weights.hpp>

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace hybridrl::testing {
inline CausalLM sharded_fixture() { return load_causal_lm(std::string(HYBRIDRL_FIXTURES_DIR) + "/models/llama"); }

// Eight rows of varied lengths (right padding), the last tokens of each the "response"; rows
// [r * n, (r + 1) * n) are rank r's share, and micro-batch m of a share its m-th half.
inline TensorBatch sharded_rows(int64_t first, int64_t count) {
  const int64_t T = 9;
  auto ids = at::zeros({count, T}, at::kLong), mask = at::zeros({count, T}, at::kLong), rmask = at::zeros({count, T}, at::kLong);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t row = first + i, len = 5 + row % 5;
    for (int64_t t = 0; t < len; ++t) ids[i][t] = (row * 37 + t * 11) % 300 + 3;
    mask[i].narrow(0, 0, len).fill_(1);
    rmask[i].narrow(0, len - 3, 3).fill_(1);
  }
  return TensorBatch({{keys::input_ids.str(), ids},
                      {keys::attention_mask.str(), mask},
                      {keys::response_mask.str(), rmask}});
}
// Mean over rows of each row's mean response log-prob, negated: a rank's loss over its share, so
// the ranks' average is the loss of the whole batch (equal shares).
template <class E>
at::Tensor row_mean_loss(E& e, const TensorBatch& b) {
  auto lp = e.forward(b).tensor(keys::log_probs);
  auto m = b.tensor(keys::response_mask).to(lp.device(), lp.dtype());
  return -((lp * m).sum(1) / m.sum(1)).mean();
}
// Full weights by name, from export_weights.
template <class E>
std::map<std::string, at::Tensor> exported(const E& e, int64_t* buckets = nullptr, const WeightSpec& spec = {}) {
  std::map<std::string, at::Tensor> out;
  int64_t n = 0;
  e.export_weights(spec, [&](const WeightBucket& b) {
    ++n;
    for (const auto& t : b) out[t.name] = t.tensor.clone();
  });
  if (buckets != nullptr) *buckets = n;
  return out;
}
// Three steps, each two micro-batches of this engine's share [first, first + rows): the gradient norms.
template <class E>
std::vector<double> train_three(E& e, int64_t first, int64_t rows) {
  std::vector<double> norms;
  for (int step = 0; step < 3; ++step) {
    const int64_t half = rows / 2;
    for (int m = 0; m < 2; ++m) e.backward(row_mean_loss(e, sharded_rows(first + m * half, half)) / 2);
    norms.push_back(e.step().template item<double>());
  }
  return norms;
}
inline std::shared_ptr<Communicator> borrowed(Communicator& c) {
  return std::shared_ptr<Communicator>(&c, [](Communicator*) {});
}
inline double norm_rel(const at::Tensor& a, const at::Tensor& b) {
  return ((a - b).norm() / b.norm().clamp_min(1e-12)).item<double>();
}
}  // namespace hybridrl::testing

namespace hybridrl::testing {
// The largest per-tensor ||a - b|| / ||b|| over the tensors of `b`.
inline double worst_rel(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
  double worst = 0;
  for (const auto& [name, t] : b) worst = std::max(worst, norm_rel(a.at(name), t));
  return worst;
}
}  // namespace hybridrl::testing
