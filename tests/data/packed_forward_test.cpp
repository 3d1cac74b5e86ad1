// Loader<Packed>'s layout fed to the model's packed forward gives the same per-sequence log-probs
// as running each sequence alone (tiny random model, fixed seed).

#include <sstream>
#include <string>
#include <vector>

#include "hybridrl/data/data.hpp"
#include "hybridrl/model/causal_lm.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;

namespace {

ModelConfig tiny_byte_model() {
  ModelConfig c;
  c.vocab_size = ByteTokenizer{}.vocab_size();
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  return c;
}

// Sum of log p(ids[t] | ids[<t]) over response tokens t (response_mask 1), for one row of logits.
double response_log_prob(const at::Tensor& logits_row, const std::vector<int64_t>& ids,
                         const std::vector<int64_t>& resp, int64_t offset) {
  auto lp = at::log_softmax(logits_row.to(at::kDouble), -1);
  double s = 0;
  for (size_t t = 1; t < ids.size(); ++t) {
    if (resp[t] == 1) s += lp[offset + static_cast<int64_t>(t) - 1][ids[t]].item<double>();
  }
  return s;
}

std::vector<int64_t> row_vec(const at::Tensor& t, int64_t r) {
  auto c = t[r].to(at::kLong).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

// Per-token log-probs of a [R, L] forward, aligned with the tokens (keys.hpp): entry t is
// log p(ids[t] | earlier tokens of its sequence), 0 where position_ids is 0 (a sequence start).
at::Tensor token_log_probs(const at::Tensor& logits, const at::Tensor& ids, const at::Tensor& pos) {
  auto lp = at::log_softmax(logits.to(at::kDouble), -1);
  auto next = lp.slice(1, 0, -1).gather(-1, ids.slice(1, 1).unsqueeze(-1)).squeeze(-1);
  auto out = at::cat({at::zeros({ids.size(0), 1}, next.options()), next}, 1);
  return out * (pos > 0).to(at::kDouble);
}

}  // namespace

TEST_SUITE("data/packed_forward") {
  TEST_CASE("packed rows give the same per-sequence log-probs as unpacked forwards, through pack/unpack") {
    at::manual_seed(0);
    CausalLM model(tiny_byte_model());
    model->eval();
    at::NoGradGuard no_grad;
    std::string text;
    const char* prompts[] = {"hi", "what?", "a", "tell me", "ok", "x y z"};
    for (int i = 0; i < 6; ++i) {
      text += std::string("{\"prompt\": \"") + prompts[i] + "\", \"chosen\": \"" +
              std::string(static_cast<size_t>(2 + i), 'c') + "\", \"rejected\": \"" +
              std::string(static_cast<size_t>(7 - i), 'r') + "\", \"uid\": \"u" + std::to_string(i) + "\"}\n";
    }
    std::istringstream in(text);
    auto data = std::make_shared<const PreferenceDataset>(
        PreferenceDataset::from_stream(in, "mem.jsonl", ByteTokenizer{}));
    const auto opts = PackedOptions{}.batch_size(6).row_length(24).prefetch_factor(0);
    auto loader = Loader<Packed>::make(data, opts);
    auto b = loader.next();
    REQUIRE(b);
    const auto p = Loader<Packed>::pack(*b, opts);
    const auto& ids = p.rows.tensor(keys::input_ids);
    REQUIRE(ids.size(0) >= 2);  // several rows, several sequences per row
    REQUIRE(ids.size(0) < p.sequences());
    const auto logits = model->forward(ids, ForwardArgs{}.cu_seqlens(p.rows.tensor(keys::cu_seqlens)));
    const auto lp = token_log_probs(logits, ids, p.rows.tensor(keys::position_ids));
    const auto resp = p.rows.tensor(keys::response_mask).to(at::kDouble);
    // the packed path: per-token log-probs × response mask, summed per sequence by unpack_sum
    for (const std::string role : {"chosen_", "rejected_"}) {
      CAPTURE(role);
      const auto sums = unpack_sum(p, lp * resp, role);
      REQUIRE(sums.size(0) == b->size());
      for (int64_t row = 0; row < b->size(); ++row) {
        // the same sequence alone, unpadded
        const auto mask = row_vec(b->tensor(role + "attention_mask"), row);
        const auto n = std::count(mask.begin(), mask.end(), 1);
        auto tok = row_vec(b->tensor(role + "input_ids"), row);
        auto rm = row_vec(b->tensor(role + "response_mask"), row);
        tok.resize(static_cast<size_t>(n));  // right-padded: the real tokens come first
        rm.resize(static_cast<size_t>(n));
        auto alone = model->forward(at::tensor(tok, at::kLong).unsqueeze(0));
        const double want = response_log_prob(alone[0], tok, rm, 0);
        CHECK(sums[row].item<double>() == doctest::Approx(want).epsilon(1e-5));
      }
    }
    // and against the padded per-sequence batch itself: unpack gives the [B, T] layout whose
    // entries equal the padded forward's per-token log-probs on every real token
    const auto plogits = model->forward(b->tensor(keys::chosen_input_ids),
                                        ForwardArgs{}.attention_mask(b->tensor(keys::chosen_attention_mask)));
    const auto padded_lp = token_log_probs(plogits, b->tensor(keys::chosen_input_ids),
                                           b->tensor(keys::chosen_position_ids));
    const auto unpacked = unpack(p, lp, "chosen_");
    REQUIRE(unpacked.sizes() == padded_lp.sizes());
    const auto real = b->tensor(keys::chosen_attention_mask).to(at::kDouble);
    CHECK((unpacked * real - padded_lp * real).abs().max().item<double>() < 1e-5);
    CHECK((unpacked * (1 - real)).abs().max().item<double>() == 0.0);
  }
}
