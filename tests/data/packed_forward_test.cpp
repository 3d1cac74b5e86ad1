// Loader<Packed>'s layout fed to the model's packed forward gives the same per-sequence log-probs
// as running each sequence alone (tiny random model, fixed seed).

#include <sstream>
#include <string>
#include <vector>

#include "hybridrl/data/data.hpp"
#include "hybridrl/model/causal_lm.hpp"
#include <doctest/doctest.h>  // last: c10 defines a CHECK macro of its own

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

// Sum of log p(ids[t] | ids[<t]) over response tokens t (loss_mask 1), for one row of logits.
double response_log_prob(const at::Tensor& logits_row, const std::vector<int64_t>& ids,
                         const std::vector<int64_t>& loss, int64_t offset) {
  auto lp = at::log_softmax(logits_row.to(at::kDouble), -1);
  double s = 0;
  for (size_t t = 1; t < ids.size(); ++t) {
    if (loss[t] == 1) s += lp[offset + static_cast<int64_t>(t) - 1][ids[t]].item<double>();
  }
  return s;
}

}  // namespace

TEST_SUITE("data/packed_forward") {
  TEST_CASE("packed rows give the same per-sequence log-probs as unpacked forwards") {
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
    auto loader = Loader<Packed>::make(data, PackedOptions{}.batch_size(6).row_length(24).prefetch_factor(0));
    auto b = loader.next();
    REQUIRE(b);
    REQUIRE(b->tensor("input_ids").size(0) >= 2);  // several rows, several sequences per row
    const auto logits = model->forward(b->tensor("input_ids"), ForwardArgs{}.cu_seqlens(b->tensor("cu_seqlens")));
    const auto& meta = b->meta();
    const auto n_seq = meta["sequence_unit"].size();
    std::vector<double> packed(n_seq, 0.0);
    std::vector<int64_t> checked(n_seq, 0);
    const auto ids = b->tensor("input_ids"), seg = b->tensor("segment_ids"), loss = b->tensor("loss_mask");
    for (int64_t r = 0; r < ids.size(0); ++r) {
      int64_t start = 0;
      while (start < ids.size(1) && seg[r][start].item<int64_t>() >= 0) {
        const auto s = seg[r][start].item<int64_t>();
        int64_t end = start;
        std::vector<int64_t> tok, lm;
        while (end < ids.size(1) && seg[r][end].item<int64_t>() == s) {
          tok.push_back(ids[r][end].item<int64_t>());
          lm.push_back(loss[r][end].item<int64_t>());
          ++end;
        }
        packed[static_cast<size_t>(s)] = response_log_prob(logits[r], tok, lm, start);
        // the same sequence alone, unpacked
        auto alone = model->forward(at::tensor(tok, at::kLong).unsqueeze(0));
        const double want = response_log_prob(alone[0], tok, lm, 0);
        CHECK(packed[static_cast<size_t>(s)] == doctest::Approx(want).epsilon(1e-5));
        ++checked[static_cast<size_t>(s)];
        start = end;
      }
    }
    for (auto c : checked) CHECK(c == 1);
    // and against the Bucketed (padded, right-padded) batch of the same units: chosen sums agree
    auto padded = Loader<Bucketed>::make(data, BucketedOptions{}.batch_size(6).shuffle(false).prefetch_factor(0));
    auto pb = padded.next();
    REQUIRE(pb);
    const auto plogits = model->forward(pb->tensor("chosen_input_ids"),
                                        ForwardArgs{}.attention_mask(pb->tensor("chosen_attention_mask")));
    for (int64_t row = 0; row < pb->size(); ++row) {
      const auto uid = pb->column("uid")[static_cast<size_t>(row)].get<std::string>();
      auto row_ids = pb->tensor("chosen_input_ids")[row].contiguous();
      auto row_loss = pb->tensor("chosen_loss_mask")[row].contiguous();
      std::vector<int64_t> tok(row_ids.data_ptr<int64_t>(), row_ids.data_ptr<int64_t>() + row_ids.numel());
      std::vector<int64_t> lm(row_loss.data_ptr<int64_t>(), row_loss.data_ptr<int64_t>() + row_loss.numel());
      const double got = response_log_prob(plogits[row], tok, lm, 0);
      // find this pair's chosen sequence among the packed ones
      bool found = false;
      for (size_t s = 0; s < n_seq; ++s) {
        if (meta["sequence_role"][s] != "chosen") continue;
        const auto unit = meta["sequence_unit"][s].get<int64_t>();
        // packed units are in sorted dataset order (batch = all 6), so unit k is sample k
        if ("u" + std::to_string(unit) != uid) continue;
        CHECK(got == doctest::Approx(packed[s]).epsilon(1e-5));
        found = true;
      }
      CHECK(found);
    }
  }
}
