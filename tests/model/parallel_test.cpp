// Tensor parallelism: ranks as threads, each holding its shard of a tiny model, give the logits,
// log-probs, entropies and values of the full model, and gradients equal to the shards of the
// full model's gradients (double precision). The shard layout below is written out here, not
// taken from the library: q/k/v/gate/up (weights and biases), embed_tokens and lm_head split on
// dim 0, o_proj/down_proj weights on dim 1, everything else replicated.
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <map>
#include <string>
#include <vector>

#include "hybridrl/model/model.hpp"
#include <hybridrl/distributed/thread_communicator.hpp>
#include "../support/tensors.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;
using namespace hybridrl::testing;
using hybridrl::run_ranks;

namespace {

ModelConfig tp_config(bool tied) {
  ModelConfig c;
  c.vocab_size = 96;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 4;
  c.tie_word_embeddings = tied;
  c.qkv_bias = !tied;
  c.attention_bias = !tied;  // o_proj bias too: a row-parallel bias
  c.mlp_bias = !tied;
  return c;
}



// The expected shard of full tensor `t` of parameter `name` for rank r of tp (independent rule).
at::Tensor expected_shard(const std::string& name, const at::Tensor& t, int64_t r, int64_t tp) {
  int64_t dim = -1;
  for (const char* col : {"q_proj.", "k_proj.", "v_proj.", "gate_proj.", "up_proj.", "embed_tokens.", "lm_head."}) {
    if (contains(name, col)) dim = 0;
  }
  if ((contains(name, "o_proj.weight") || contains(name, "down_proj.weight"))) dim = 1;
  if (dim < 0) return t;
  const auto n = t.size(dim) / tp;
  return t.narrow(dim, r * n, n);
}

// Gathers a vocabulary-sharded [B, T, V/tp] into [B, T, V] with all_gather (dim 0 rank-major).
at::Tensor gather_vocab(const at::Tensor& local, Communicator& comm) {
  auto in = local.movedim(-1, 0).contiguous();
  auto sizes = in.sizes().vec();
  sizes[0] *= comm.size();
  auto out = at::empty(sizes, in.options());
  comm.all_gather_into(out, in);
  return out.movedim(0, -1);
}

struct RankResult {
  at::Tensor logits, log_probs, entropy, values, ref_logits;
  std::map<std::string, at::Tensor> grads, ref_params;
  at::Tensor score_weight;
};

}  // namespace

TEST_SUITE("model/parallel") {
  TEST_CASE("tensor-parallel shards give the full model's logits, log-probs, values and gradients") {
    for (int tp : {2, 4}) {
      for (bool tied : {false, true}) {
        CAPTURE(tp);
        CAPTURE(tied);
        const auto c = tp_config(tied);
        torch::manual_seed(21);
        CausalLM full(c);
        {
          torch::NoGradGuard g;
          for (auto& p : full->parameters()) p.normal_(0.0, 0.3);
        }
        full->to(at::kDouble);
        full->train();
        torch::manual_seed(22);
        auto ids = torch::randint(0, c.vocab_size, {2, 7});
        auto mask = torch::ones({2, 7}, at::kLong);
        mask[1].narrow(0, 0, 2).fill_(0);  // left padding
        const auto args = ForwardArgs{}.attention_mask(mask);
        const auto lpo = LogProbOptions{}.chunk_size(3).temperature(0.9);
        auto weights = torch::rand({2, 7}, at::kDouble);  // a loss that weighs every position differently

        // the full model: the oracle
        for (auto& p : full->parameters()) p.mutable_grad() = at::Tensor();
        auto want_logits = full->forward(ids, args).detach();
        auto want = token_log_probs(full, ids, args, lpo);
        ((want.log_probs * weights).sum() + 0.3 * want.entropy.sum()).backward();
        std::map<std::string, at::Tensor> want_grads;
        for (auto& p : full->named_parameters()) want_grads[p.key()] = p.value().grad().clone();
        auto want_hidden = full->hidden_states(ids, args).detach();

        std::vector<RankResult> got(static_cast<size_t>(tp));
        run_ranks(static_cast<int>(tp), [&](Communicator& comm) {
          const int r = comm.rank();
          const ParallelContext pc{r, tp, &comm};
          auto& out = got[static_cast<size_t>(r)];
          // a trainable shard filled from the full weights
          CausalLM shard(c, pc);
          shard->to(at::kDouble);
          hybridrl::detail::copy_parameters(*shard, *full, pc);
          shard->train();
          out.logits = gather_vocab(shard->forward(ids, args).detach(), comm);
          auto lp = token_log_probs(shard, ids, args, lpo);
          ((lp.log_probs * weights).sum() + 0.3 * lp.entropy.sum()).backward();
          out.log_probs = lp.log_probs.detach();
          out.entropy = lp.entropy.detach();
          for (auto& p : shard->named_parameters()) out.grads[p.key()] = p.value().grad().clone();
          // the reference copies only this rank's shard of the full policy
          auto ref = make_reference(full, pc);
          for (auto& p : ref->named_parameters()) out.ref_params[p.key()] = p.value().detach();
          {
            torch::NoGradGuard g;
            out.ref_logits = gather_vocab(ref->forward(ids, args), comm);
            auto critic = make_value_model(full, pc);
            out.values = critic->forward(ids, args);
            out.score_weight = critic->score->weight.detach().clone();
          }
        });

        for (int r = 0; r < tp; ++r) {
          CAPTURE(r);
          const auto& g = got[static_cast<size_t>(r)];
          CHECK(max_diff(g.logits, want_logits) < 1e-10);
          CHECK(max_diff(g.ref_logits, want_logits) < 1e-10);
          CHECK(max_diff(g.log_probs, want.log_probs.detach()) < 1e-10);
          CHECK(max_diff(g.entropy, want.entropy.detach()) < 1e-10);
          REQUIRE(g.grads.size() == want_grads.size());
          double worst = 0;
          for (const auto& [name, grad] : g.grads) {
            auto w = expected_shard(name, want_grads.at(name), r, tp);
            REQUIRE((grad.sizes() == w.sizes()));
            worst = std::max(worst, max_diff(grad, w));
          }
          CHECK(worst < 1e-10);
          for (const auto& [name, p] : g.ref_params) {
            auto w = expected_shard(name, full->named_parameters()[name].detach(), r, tp);
            REQUIRE((p.sizes() == w.sizes()));  // a shard, not a full copy
            CHECK(max_diff(p, w) == 0.0);
          }
          // the critic: score replicated from rank 0, values = full trunk · score
          CHECK(max_diff(g.score_weight, got[0].score_weight) == 0.0);
          auto vwant = want_hidden.matmul(g.score_weight.t()).squeeze(-1);  // score bias is 0
          CHECK(max_diff(g.values, vwant.to(at::kFloat)) < 1e-5);
        }
      }
    }
  }

  TEST_CASE("parallel layers at tp_size 1 are plain Linear and Embedding, names and values") {
    torch::manual_seed(23);
    ColumnParallelLinear col(6, 4, true);
    torch::manual_seed(23);
    torch::nn::Linear lin(torch::nn::LinearOptions(6, 4).bias(true));
    CHECK(max_diff(col->weight, lin->weight) == 0.0);  // same initialisation draws
    CHECK(max_diff(col->bias, lin->bias) == 0.0);
    auto x = torch::randn({3, 6});
    CHECK(max_diff(col(x), lin(x)) == 0.0);
    RowParallelLinear row(6, 4, false);
    CHECK(row->named_parameters().size() == 1);  // no bias parameter when bias = false
    CHECK(max_diff(row(x), x.matmul(row->weight.t())) < 1e-6);
    torch::manual_seed(24);
    VocabParallelEmbedding emb(10, 3);
    torch::manual_seed(24);
    torch::nn::Embedding ref(10, 3);
    auto ids = torch::tensor({{1, 9, 0}}, at::kLong);
    CHECK(max_diff(emb(ids), ref(ids)) == 0.0);
  }

  TEST_CASE("a layout the heads do not divide, or a missing communicator, is an error") {
    const auto c = tp_config(false);
    CHECK_THROWS_WITH_AS(run_ranks(3, [&](Communicator& comm) { CausalLM m(c, ParallelContext{comm.rank(), 3, &comm}); }),
                         doctest::Contains("num_attention_heads = 8 is not divisible by tp_size = 3"), Error);
    CHECK_THROWS_WITH_AS(CausalLM(c, ParallelContext{0, 2, nullptr}), doctest::Contains("tp = nullptr but tp_size = 2"),
                         Error);
    CHECK_THROWS_WITH_AS(CausalLM(c, ParallelContext{2, 2, nullptr}), doctest::Contains("tp_rank = 2 must lie in [0, tp_size = 2)"),
                         Error);
  }
}
