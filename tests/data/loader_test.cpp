// Loader<Bucketed> and Loader<Packed>: batch contents by hand (keys of core/keys.hpp), the packed
// layout through pack(), determinism, exact resume through JSON (including at epoch boundaries),
// concat of consecutive batches, prefetch errors and shutdown (no timing assumptions), option errors.

#include <atomic>
#include <map>
#include <ostream>
#include <chrono>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "hybridrl/algorithm/kto.hpp"
#include "hybridrl/data/data.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;

namespace {

template <class D>
D from_text(const std::string& text, DatasetOptions o = {}) {
  std::istringstream in(text);
  return D::from_stream(in, "mem.jsonl", ByteTokenizer{}, o);
}

// n prompts of pseudo-random lengths 1..max_len bytes, uid "u<i>".
std::string prompt_lines(int n, int max_len, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> d(1, max_len);
  std::string out;
  for (int i = 0; i < n; ++i) {
    out += "{\"prompt\": \"" + std::string(static_cast<size_t>(d(g)), 'x') + "\", \"uid\": \"u" +
           std::to_string(i) + "\"}\n";
  }
  return out;
}

std::string pair_lines(int n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> d(1, 12);
  std::string out;
  for (int i = 0; i < n; ++i) {
    out += "{\"prompt\": \"" + std::string(static_cast<size_t>(d(g)), 'p') + "\", \"chosen\": \"" +
           std::string(static_cast<size_t>(d(g)), 'c') + "\", \"rejected\": \"" +
           std::string(static_cast<size_t>(d(g)), 'r') + "\", \"uid\": \"u" + std::to_string(i) +
           "\"}\n";
  }
  return out;
}

// A batch reduced to comparable values: its uids, its input ids and the loader's BatchInfo.
struct Fingerprint {
  nlohmann::json uids;
  std::vector<int64_t> ids;
  BatchInfo info;
  bool operator==(const Fingerprint&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Fingerprint& f) {
  return os << "batch (epoch " << f.info.epoch << ", step " << f.info.step_in_epoch << ") uids "
            << f.uids.dump();
}

Fingerprint fingerprint(const TensorBatch& b, const std::string& ids_key, const BatchInfo& info) {
  auto t = b.tensor(ids_key).contiguous();
  return {nlohmann::json(b.column("uid")),
          std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel()), info};
}

template <class L>
std::vector<Fingerprint> drain(L& loader, const std::string& ids_key, int64_t limit = 1 << 30) {
  std::vector<Fingerprint> out;
  for (int64_t i = 0; i < limit; ++i) {
    auto b = loader.next();
    if (!b) break;
    CHECK(b->meta().empty());  // per-batch facts are loader state, never metadata
    out.push_back(fingerprint(*b, ids_key, loader.info()));
  }
  return out;
}

// The options of policy P with the fields both share set.
template <class P>
typename P::options_type common_options(int64_t batch_size, uint64_t seed, int64_t epochs) {
  return typename P::options_type{}.batch_size(batch_size).seed(seed).epochs(epochs);
}

std::vector<int64_t> row_of(const at::Tensor& t, int64_t r) {
  auto row = t[r].contiguous();
  return {row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel()};
}

std::vector<int64_t> flat(const at::Tensor& t) {
  auto c = t.to(at::kLong).contiguous().view({-1});
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

// Runs `loader_factory(state)` uninterrupted, then split at every batch k: k batches, save the
// state through a JSON string, resume a new loader and check it yields exactly the rest.
template <class Make>
void check_resume_everywhere(Make make, const std::string& ids_key, int64_t expected_total) {
  auto full_loader = make(std::nullopt);
  const auto full = drain(full_loader, ids_key);
  REQUIRE(static_cast<int64_t>(full.size()) == expected_total);
  for (int64_t k = 0; k <= expected_total; ++k) {
    auto first = make(std::nullopt);
    auto head = drain(first, ids_key, k);
    REQUIRE(static_cast<int64_t>(head.size()) == k);
    const std::string saved = nlohmann::json(first.state()).dump();
    auto resumed = make(nlohmann::json::parse(saved).get<LoaderState>());
    auto tail = drain(resumed, ids_key);
    REQUIRE(static_cast<int64_t>(tail.size()) == expected_total - k);
    for (size_t i = 0; i < tail.size(); ++i) {
      CHECK_MESSAGE(tail[i] == full[static_cast<size_t>(k) + i], "split at ", k, ", batch ", i);
    }
  }
}

}  // namespace

TEST_SUITE("data/loader") {
  TEST_CASE("Bucketed prompt batch by hand: left padding, positions, columns") {
    auto d = from_text<PromptDataset>(
        "{\"prompt\": \"a\", \"answer\": \"1\", \"topic\": \"t\"}\n{\"prompt\": \"abc\", \"data_source\": \"s\"}\n");
    auto loader = Loader<Bucketed>::make(std::move(d), BucketedOptions{}.batch_size(2).shuffle(false));
    auto b = loader.next();
    REQUIRE(b);
    // sorted longest first: "abc" (4 tokens with BOS), then "a" (2 tokens)
    const int64_t pad = ByteTokenizer::kPad, bos = ByteTokenizer::kBos;
    CHECK(row_of(b->tensor("input_ids"), 0) == std::vector<int64_t>{bos, 'a', 'b', 'c'});
    CHECK(row_of(b->tensor("input_ids"), 1) == std::vector<int64_t>{pad, pad, bos, 'a'});
    CHECK(row_of(b->tensor("attention_mask"), 1) == std::vector<int64_t>{0, 0, 1, 1});
    CHECK(row_of(b->tensor("position_ids"), 0) == std::vector<int64_t>{0, 1, 2, 3});
    CHECK(row_of(b->tensor("position_ids"), 1) == std::vector<int64_t>{0, 0, 0, 1});
    CHECK(b->column("prompt") == Column{"abc", "a"});
    CHECK(b->column("answer") == Column{nullptr, "1"});
    CHECK(b->column("data_source") == Column{"s", "mem"});
    CHECK(b->column("uid") == Column{"mem:2", "mem:1"});
    CHECK(b->column("extra")[1] == nlohmann::json{{"topic", "t"}});
    CHECK(b->meta().empty());
    CHECK(loader.info().real_tokens == 6);
    CHECK(loader.info().padded_tokens == 8);
    CHECK(loader.info().epoch_end);
    CHECK_FALSE(b->has_tensor("response_mask"));  // prompts: nothing to train on yet
    CHECK_FALSE(loader.next());
    CHECK(loader.state().epoch == 1);
    CHECK(loader.state().batch_in_epoch == 0);
    CHECK(loader.statistics().padding_waste() == doctest::Approx(0.25));
  }

  TEST_CASE("Bucketed DPO and KTO batches keep pairs together") {
    auto pairs = from_text<PreferenceDataset>(
        "{\"prompt\": \"p\", \"chosen\": \"cc\", \"rejected\": \"r\"}\n");
    auto lp = Loader<Bucketed>::make(std::move(pairs), BucketedOptions{}.prefetch_factor(0));
    auto b = lp.next();
    REQUIRE(b);
    const int64_t pad = ByteTokenizer::kPad, bos = ByteTokenizer::kBos, eos = ByteTokenizer::kEos;
    CHECK(row_of(b->tensor("chosen_input_ids"), 0) == std::vector<int64_t>{bos, 'p', 'c', 'c', eos});
    CHECK(row_of(b->tensor("rejected_input_ids"), 0) == std::vector<int64_t>{bos, 'p', 'r', eos, pad});
    // response_mask has input_ids' shape, 1 on the response (EOS included), 0 on BOS/prompt/pad
    CHECK(row_of(b->tensor(keys::chosen_response_mask), 0) == std::vector<int64_t>{0, 0, 1, 1, 1});
    CHECK(row_of(b->tensor(keys::rejected_response_mask), 0) == std::vector<int64_t>{0, 0, 1, 1, 0});
    CHECK(b->column("chosen") == Column{"cc"});
    b->require({keys::chosen_input_ids, keys::chosen_attention_mask, keys::chosen_position_ids,
                keys::chosen_response_mask, keys::rejected_input_ids, keys::rejected_attention_mask,
                keys::rejected_position_ids, keys::rejected_response_mask, keys::uid},
               "DPO loader output");
  }

  TEST_CASE("KTO batch: desirable [B] bool; the mismatched pair of row i is row (i - 1) mod B (TRL)") {
    // Three units of equal length (5 tokens with BOS/EOS) so the stable order keeps [0, 1, 2].
    auto kto = from_text<LabelledDataset>(
        "{\"prompt\": \"a\", \"completion\": \"xx\", \"label\": true}\n"
        "{\"prompt\": \"bb\", \"completion\": \"y\", \"label\": false}\n"
        "{\"prompt\": \"c\", \"completion\": \"zz\", \"label\": true}\n");
    auto lk = Loader<Bucketed>::make(std::move(kto), BucketedOptions{}.batch_size(3).shuffle(false));
    auto b = lk.next();
    REQUIRE(b);
    const int64_t pad = ByteTokenizer::kPad, bos = ByteTokenizer::kBos, eos = ByteTokenizer::kEos;
    CHECK(row_of(b->tensor(keys::input_ids), 0) == std::vector<int64_t>{bos, 'a', 'x', 'x', eos, pad});
    // TRL's _get_kl_dataset: completions rotated [c[-1]] + c[:-1], so prompt i meets completion
    // i - 1: a + zz (row 2), bb + xx (row 0), c + y (row 1).
    CHECK(row_of(b->tensor(keys::kl_input_ids), 0) == std::vector<int64_t>{bos, 'a', 'z', 'z', eos, pad});
    CHECK(row_of(b->tensor(keys::kl_input_ids), 1) == std::vector<int64_t>{bos, 'b', 'b', 'x', 'x', eos});
    CHECK(row_of(b->tensor(keys::kl_input_ids), 2) == std::vector<int64_t>{bos, 'c', 'y', eos, pad, pad});
    CHECK(row_of(b->tensor(keys::kl_response_mask), 1) == std::vector<int64_t>{0, 0, 0, 1, 1, 1});
    CHECK(row_of(b->tensor(keys::response_mask), 2) == std::vector<int64_t>{0, 0, 1, 1, 1, 0});
    const auto& desirable = b->tensor(keys::desirable);
    CHECK((desirable.scalar_type() == at::kBool));
    CHECK(desirable.equal(at::tensor({1, 0, 1}, at::kByte).to(at::kBool)));
    CHECK_FALSE(b->has_tensor("label"));
    // the loss side's convention is the same: kto_mismatched_index(B)[i] is the row whose
    // completion row i's mismatched pair carries
    const auto partner = kto_mismatched_index(3);
    auto response_tokens = [&](const std::string& prefix, int64_t r) {
      const auto ids = row_of(b->tensor(prefix + "input_ids"), r), m = row_of(b->tensor(prefix + "response_mask"), r);
      std::vector<int64_t> out;
      for (size_t t = 0; t < ids.size(); ++t) {
        if (m[t] == 1) out.push_back(ids[t]);
      }
      return out;
    };
    for (int64_t i = 0; i < 3; ++i) CHECK(response_tokens("kl_", i) == response_tokens("", partner[i].item<int64_t>()));
    b->require({keys::input_ids, keys::attention_mask, keys::response_mask, keys::kl_input_ids,
                keys::kl_attention_mask, keys::kl_response_mask, keys::desirable},
               "KTO loader output");
  }

  TEST_CASE("Packed DPO: per-sequence batches; pack() restarts positions, cu_seqlens, masks; exact rebuild") {
    auto data = std::make_shared<const PreferenceDataset>(from_text<PreferenceDataset>(pair_lines(40, 1)));
    const auto opts = PackedOptions{}.batch_size(8).row_length(32).seed(3);
    auto loader = Loader<Packed>::make(data, opts);
    int64_t batches = 0, units = 0, real = 0, positions = 0;
    while (auto b = loader.next()) {
      ++batches;
      CHECK(b->size() == 8);  // one row per pair: the batch is per-sequence
      const auto p = Loader<Packed>::pack(*b, opts);
      REQUIRE(p.roles == std::vector<std::string>{"chosen_", "rejected_"});
      const auto& ids = p.rows.tensor(keys::input_ids);
      const auto rows = ids.size(0);
      const auto n_seq = p.sequences();
      CHECK(n_seq == 16);
      std::vector<std::vector<int64_t>> rebuilt(static_cast<size_t>(n_seq));
      std::vector<int64_t> loss_tokens(static_cast<size_t>(n_seq), 0);
      for (int64_t r = 0; r < rows; ++r) {
        const auto tok = row_of(ids, r), pos = row_of(p.rows.tensor(keys::position_ids), r),
                   seg = row_of(p.rows.tensor(keys::segment_ids), r),
                   loss = row_of(p.rows.tensor(keys::response_mask), r),
                   mask = row_of(p.rows.tensor(keys::attention_mask), r);
        auto cu = p.rows.tensor(keys::cu_seqlens)[r].to(at::kLong).contiguous();
        std::vector<int64_t> bounds(cu.data_ptr<int64_t>(), cu.data_ptr<int64_t>() + cu.numel());
        int64_t k = 0;
        for (int64_t t = 0; t < 32; ++t) {
          if (seg[static_cast<size_t>(t)] < 0) {
            CHECK(mask[static_cast<size_t>(t)] == 0);
            continue;
          }
          auto& s = rebuilt[static_cast<size_t>(seg[static_cast<size_t>(t)])];
          if (s.empty()) {
            CHECK(bounds[static_cast<size_t>(k)] == t);  // a sequence starts at its boundary
            ++k;
          }
          CHECK(pos[static_cast<size_t>(t)] == static_cast<int64_t>(s.size()));  // restarts at 0
          s.push_back(tok[static_cast<size_t>(t)]);
          loss_tokens[static_cast<size_t>(seg[static_cast<size_t>(t)])] += loss[static_cast<size_t>(t)];
        }
        const auto used = std::count_if(mask.begin(), mask.end(), [](int64_t m) { return m == 1; });
        CHECK(bounds.back() == used);
      }
      // every pair's chosen and rejected sequence is in the packed rows, token for token: the
      // uid column of the per-sequence batch names the sample of each unit
      const auto unit = flat(p.sequence_unit), role = flat(p.sequence_role);
      for (int64_t si = 0; si < n_seq; ++si) {
        const auto u = static_cast<size_t>(unit[static_cast<size_t>(si)]);
        const auto index = std::stoll(b->column("uid")[u].get<std::string>().substr(1));
        const auto& sample = (*data)[index];
        const bool chosen = p.roles[static_cast<size_t>(role[static_cast<size_t>(si)])] == "chosen_";
        const auto& want = chosen ? sample.chosen_ids : sample.rejected_ids;
        CHECK(rebuilt[static_cast<size_t>(si)] == want);
        CHECK(loss_tokens[static_cast<size_t>(si)] == static_cast<int64_t>(want.size()) - sample.prompt_length);
        real += static_cast<int64_t>(want.size());
      }
      positions += rows * 32;
      units += b->size();
    }
    CHECK(batches == 5);
    CHECK(units == 40);
    CHECK(static_cast<double>(positions - real) / static_cast<double>(positions) < 0.5);
  }

  TEST_CASE("each unit exactly once per epoch; seeded order differs per epoch and per seed") {
    auto data = std::make_shared<const PromptDataset>(from_text<PromptDataset>(prompt_lines(50, 30, 2)));
    auto opts = BucketedOptions{}.batch_size(4).window_batches(3).epochs(2).seed(9);
    auto a = Loader<Bucketed>::make(data, opts);
    auto b = Loader<Bucketed>::make(data, opts);
    auto c = Loader<Bucketed>::make(data, BucketedOptions(opts).seed(10));
    auto fa = drain(a, "input_ids"), fb = drain(b, "input_ids"), fc = drain(c, "input_ids");
    CHECK(fa == fb);
    CHECK(fa != fc);
    REQUIRE(fa.size() == 26);  // 13 batches per epoch
    std::vector<std::string> e0, e1;
    for (const auto& f : fa) {
      for (const auto& u : f.uids) (f.info.epoch == 0 ? e0 : e1).push_back(u.get<std::string>());
    }
    CHECK(e0 != e1);
    std::sort(e0.begin(), e0.end());
    std::sort(e1.begin(), e1.end());
    CHECK(e0 == e1);
    CHECK(std::adjacent_find(e0.begin(), e0.end()) == e0.end());
    CHECK(e0.size() == 50);
  }

  TEST_CASE("resume through JSON at every position yields the same batches (Bucketed, budget)") {
    auto data = std::make_shared<const PromptDataset>(from_text<PromptDataset>(prompt_lines(30, 40, 4)));
    auto opts = BucketedOptions{}.batch_size(8).max_tokens_per_batch(120).window_batches(2).epochs(3).seed(5);
    auto first = Loader<Bucketed>::make(data, opts);
    const int64_t total = first.batches_in_epoch(0) + first.batches_in_epoch(1) + first.batches_in_epoch(2);
    check_resume_everywhere(
        [&](std::optional<LoaderState> s) { return Loader<Bucketed>::make(data, opts, s); },
        "input_ids", total);
  }

  TEST_CASE("resume at an epoch boundary starts the next epoch, nothing skipped (Packed, prefetch)") {
    auto data = std::make_shared<const PreferenceDataset>(from_text<PreferenceDataset>(pair_lines(12, 7)));
    auto opts = PackedOptions{}.batch_size(4).row_length(40).epochs(3).seed(1).prefetch_factor(3);
    auto loader = Loader<Packed>::make(data, opts);
    for (int i = 0; i < 3; ++i) REQUIRE(loader.next());
    const auto s = loader.state();
    CHECK(s.epoch == 1);
    CHECK(s.batch_in_epoch == 0);
    const auto j = nlohmann::json(s);
    CHECK(j == nlohmann::json{{"seed", 1}, {"epoch", 1}, {"batch_in_epoch", 0}, {"dataset_size", 12},
                              {"loader", "Packed"}});
    // an "exhausted epoch 0" state written by someone else is read as the start of epoch 1
    auto exhausted = s;
    exhausted.epoch = 0;
    exhausted.batch_in_epoch = 3;
    auto resumed = Loader<Packed>::make(data, opts, exhausted);
    auto rest = drain(resumed, "chosen_input_ids");
    CHECK(rest.size() == 6);
    CHECK(rest.front().info.epoch == 1);
    check_resume_everywhere(
        [&](std::optional<LoaderState> st) { return Loader<Packed>::make(data, opts, st); },
        "chosen_input_ids", 9);
  }

  TEST_CASE("prefetched batches are in pinned memory exactly when CUDA is present (and pin_memory is on)") {
    auto data = from_text<PromptDataset>(prompt_lines(8, 12, 5));
    auto pinned = Loader<Bucketed>::make(data, BucketedOptions{}.batch_size(4).prefetch_factor(2));
    auto plain = Loader<Bucketed>::make(data, BucketedOptions{}.batch_size(4).prefetch_factor(2).pin_memory(false));
    auto a = pinned.next();
    auto b = plain.next();
    REQUIRE(a);
    REQUIRE(b);
    for (const auto& key : a->tensor_keys()) {
      CAPTURE(key);
      CHECK(a->tensor(key).is_pinned() == at::hasCUDA());
      CHECK_FALSE(b->tensor(key).is_pinned());
    }
  }

  TEST_CASE("endless epochs and a resumed state that does not match are errors") {
    auto data = std::make_shared<const PromptDataset>(from_text<PromptDataset>(prompt_lines(5, 10, 1)));
    auto endless = Loader<Bucketed>::make(data, BucketedOptions{}.batch_size(2).epochs(0));
    for (int i = 0; i < 20; ++i) REQUIRE(endless.next());
    CHECK(endless.state().epoch == 6);
    CHECK(endless.state().batch_in_epoch == 2);
    auto opts = BucketedOptions{}.batch_size(2);
    LoaderState s{0, 0, 1, 5, "Bucketed"};
    CHECK_NOTHROW((void)Loader<Bucketed>::make(data, opts, s));
    CHECK_THROWS_WITH_AS((void)Loader<Bucketed>::make(data, BucketedOptions(opts).seed(1), s),
                         doctest::Contains("seed 0 but loader.seed = 1"), Error);
    CHECK_THROWS_AS((void)Loader<Packed>::make(data, PackedOptions{}, s), Error);
    CHECK_THROWS_AS((void)Loader<Bucketed>::make(data, opts, LoaderState{0, 0, 1, 6, "Bucketed"}), Error);
    CHECK_THROWS_AS((void)Loader<Bucketed>::make(data, opts, LoaderState{0, 0, 4, 5, "Bucketed"}), Error);
    const nlohmann::json incomplete = {{"epoch", 1}};
    CHECK_THROWS_AS((void)incomplete.get<LoaderState>(), Error);
    // negatives and out-of-range counts are refused, not wrapped (get<uint64_t>(-1) is 2^64 - 1)
    const auto state_error = [](const nlohmann::json& j) {
      try {
        (void)j.get<LoaderState>();
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
    CHECK(state_error({{"seed", -1}, {"epoch", 0}, {"batch_in_epoch", 0}})
              .find("\"seed\" is -1, expected an integer >= 0") != std::string::npos);
    CHECK(state_error({{"seed", 1}, {"epoch", -2}, {"batch_in_epoch", 0}})
              .find("\"epoch\" is -2, expected an integer >= 0") != std::string::npos);
    CHECK(state_error({{"seed", 1}, {"epoch", 0}, {"batch_in_epoch", 18446744073709551615ULL}})
              .find("\"batch_in_epoch\" is 18446744073709551615") != std::string::npos);
    CHECK(state_error({{"seed", 1}, {"epoch", 0}, {"batch_in_epoch", 0}, {"dataset_size", -5}})
              .find("\"dataset_size\" is -5, expected an integer >= -1") != std::string::npos);
    CHECK(state_error(nlohmann::json::array({1, 2})).find("expected an object") != std::string::npos);
    // a string that is not UTF-8 (possible from C++, not from a parsed file) still gives the Error
    CHECK(state_error({{"seed", 1}, {"loader", "\xff\xfe"}}).find("loader state {") != std::string::npos);
    const LoaderState top{UINT64_MAX, 3, 1, -1, "Packed"};
    CHECK(nlohmann::json(top).get<LoaderState>() == top);  // the full seed range round-trips
  }

  TEST_CASE("bad options fail before any work") {
    auto pairs = std::make_shared<const PreferenceDataset>(from_text<PreferenceDataset>(
        "{\"prompt\": \"pppp\", \"chosen\": \"cccc\", \"rejected\": \"r\"}\n"));  // longest 10
    CHECK_THROWS_WITH_AS((void)Loader<Packed>::make(pairs, PackedOptions{}.row_length(9)),
                         doctest::Contains("row_length = 9 is shorter than the longest sequence of "
                                           "the dataset (10 tokens)"),
                         Error);
    CHECK_NOTHROW((void)Loader<Packed>::make(pairs, PackedOptions{}.row_length(10)));
    CHECK_THROWS_WITH_AS((void)Loader<Bucketed>::make(pairs, BucketedOptions{}.max_tokens_per_batch(19)),
                         doctest::Contains("10 tokens × 2 sequence(s) = 20"), Error);
    CHECK_THROWS_AS((void)Loader<Bucketed>::make(pairs, BucketedOptions{}.batch_size(0)), Error);
    CHECK_THROWS_AS((void)Loader<Packed>::make(pairs, PackedOptions{}.batch_size(0)), Error);
    CHECK_THROWS_AS((void)Loader<Bucketed>::make(pairs, BucketedOptions{}.prefetch_factor(-1)), Error);
    CHECK_THROWS_AS((void)Loader<Bucketed>::make(pairs, BucketedOptions{}.batch_size(2).drop_last(true)), Error);
    // a KL pair can join the longest prompt with the longest completion: 3 + 3 = 6 > 5
    auto kto = std::make_shared<const LabelledDataset>(from_text<LabelledDataset>(
        "{\"prompt\": \"aa\", \"completion\": \"x\", \"label\": true}\n"
        "{\"prompt\": \"b\", \"completion\": \"yy\", \"label\": false}\n"));
    CHECK_THROWS_AS((void)Loader<Packed>::make(kto, PackedOptions{}.row_length(5)), Error);
    CHECK_NOTHROW((void)Loader<Packed>::make(kto, PackedOptions{}.row_length(6)));
  }

  TEST_CASE("skipped lines show in the loader's statistics") {
    auto d = from_text<PromptDataset>("{\"prompt\": \"ok\"}\n{bad\n{\"prompt\": \"\"}\n",
                                      DatasetOptions{}.on_error(OnError::skip));
    auto loader = Loader<Bucketed>::make(std::move(d), BucketedOptions{});
    (void)loader.next();
    const auto s = loader.statistics();
    CHECK(s.data.skipped_for(LineError::bad_json) == 1);
    CHECK(s.data.skipped_for(LineError::empty_text) == 1);
    CHECK(s.batches == 1);
    CHECK(s.units == 1);
    CHECK(s.to_json()["data"]["skipped"] == 2);
  }

  TEST_CASE("prefetch: worker exceptions reach the caller after earlier items") {
    int produced = 0;
    Prefetcher<int> p(
        [&]() -> std::optional<int> {
          if (produced == 3) throw std::runtime_error("boom in worker");
          return produced++;
        },
        2);
    CHECK(p.next() == 0);
    CHECK(p.next() == 1);
    CHECK(p.next() == 2);
    CHECK_THROWS_WITH_AS(p.next(), "boom in worker", std::runtime_error);
    CHECK_THROWS_AS(p.next(), std::runtime_error);
  }

  TEST_CASE("prefetch: early stop with a full queue and an endless producer does not hang") {
    std::atomic<int> calls{0};
    {
      Prefetcher<int> p([&]() -> std::optional<int> { return calls++; }, 3);
      CHECK(p.next() == 0);
      // Items 1, 2, 3 refill the queue of depth 3 (call 4 started after item 0 was taken), then
      // the worker blocks on the full queue. Wait for that without assuming any timing...
      while (calls.load() < 4) std::this_thread::yield();
      // ...and the destructor must wake and join it.
    }
    CHECK(calls.load() == 4);  // a full queue stops the producer: no fifth call
    // and a loader dropped mid-epoch with prefetch on
    auto data = std::make_shared<const PromptDataset>(from_text<PromptDataset>(prompt_lines(100, 20, 3)));
    {
      auto loader = Loader<Bucketed>::make(data, BucketedOptions{}.batch_size(2).epochs(0).prefetch_factor(4));
      REQUIRE(loader.next());
    }
    // a Prefetcher that ends normally returns nullopt, repeatedly
    int k = 0;
    Prefetcher<int> q([&]() -> std::optional<int> { return k < 2 ? std::optional<int>(k++) : std::nullopt; }, 1);
    CHECK(q.next() == 0);
    CHECK(q.next() == 1);
    CHECK_FALSE(q.next());
    CHECK_FALSE(q.next());
  }

  TEST_CASE("prefetch: a consumer slower than the producer never waits after warm-up") {
    // "Slower" made exact instead of by sleeps: before asking for item i the consumer waits until
    // the producer has begun call i + 2, which it does only after pushing item i.
    std::atomic<int> calls{0};
    Prefetcher<int> p(
        [&, n = 0]() mutable -> std::optional<int> {
          ++calls;
          return n < 40 ? std::optional<int>(n++) : std::nullopt;
        },
        2);
    for (int i = 0; i < 40; ++i) {
      while (calls.load() < i + 2) std::this_thread::yield();
      auto v = p.next();
      REQUIRE(v);
      CHECK(*v == i);
    }
    CHECK(p.waits() == 0);
    CHECK_FALSE(p.next());
  }

  TEST_CASE("prefetch: a consumer faster than the producer counts its waits") {
    // The producer blocks on a gate the consumer opens only after it has started waiting: every
    // next() after the first must wait.
    std::atomic<int> gate{0};
    Prefetcher<int> p(
        [&, n = 0]() mutable -> std::optional<int> {
          while (gate.load() <= n) std::this_thread::yield();
          return n < 3 ? std::optional<int>(n++) : std::nullopt;
        },
        1);
    gate = 1;
    CHECK(p.next() == 0);
    for (int i = 1; i < 3; ++i) {
      std::thread opener([&, i] {
        while (p.waits() < i) std::this_thread::yield();
        gate = i + 1;
      });
      CHECK(p.next() == i);
      opener.join();
    }
    CHECK(p.waits() == 2);
    gate = 100;  // let the producer reach its end so the destructor can join it
  }

  TEST_CASE_TEMPLATE("both loaders: same samples per epoch, same keys, exact resume", P, Loader<Bucketed>,
                     Loader<Packed>) {
    auto data = std::make_shared<const PreferenceDataset>(from_text<PreferenceDataset>(pair_lines(21, 5)));
    const auto opts = common_options<P>(4, 11, 2);
    auto loader = P::make(data, opts);
    std::vector<std::string> e0, e1;
    std::set<std::string> keys0;
    int64_t batches = 0;
    while (auto b = loader.next()) {
      ++batches;
      if (batches == 1) {
        const auto k = b->tensor_keys();
        keys0.insert(k.begin(), k.end());
      }
      const auto k = b->tensor_keys();
      CHECK(std::set<std::string>(k.begin(), k.end()) == keys0);
      CHECK(b->meta().empty());
      for (const Value& u : b->column(keys::uid)) (loader.info().epoch == 0 ? e0 : e1).push_back(u.get<std::string>());
    }
    CHECK(batches == 12);  // 21 pairs in batches of 4: 6 per epoch
    CHECK(keys0 == std::set<std::string>{"chosen_attention_mask", "chosen_input_ids", "chosen_position_ids",
                                         "chosen_response_mask", "rejected_attention_mask",
                                         "rejected_input_ids", "rejected_position_ids",
                                         "rejected_response_mask"});
    std::sort(e0.begin(), e0.end());
    std::sort(e1.begin(), e1.end());
    CHECK(e0.size() == 21);
    CHECK(std::adjacent_find(e0.begin(), e0.end()) == e0.end());
    CHECK(e0 == e1);
    check_resume_everywhere([&](std::optional<LoaderState> s) { return P::make(data, opts, s); },
                            "chosen_input_ids", 12);
  }

  TEST_CASE_TEMPLATE("two consecutive loader batches concat; slices carry only their own facts", P,
                     Loader<Bucketed>, Loader<Packed>) {
    auto data = std::make_shared<const PromptDataset>(from_text<PromptDataset>(prompt_lines(9, 20, 8)));
    auto loader = P::make(data, common_options<P>(4, 2, 1));
    auto a = loader.next();
    const auto ia = loader.info();
    auto b = loader.next();
    const auto ib = loader.info();
    REQUIRE(a);
    REQUIRE(b);
    CHECK(ia.step_in_epoch == 0);
    CHECK(ib.step_in_epoch == 1);
    // The two batches differ in width (each is padded to its own longest prompt) and in step; the
    // loader's padding makes them one left-padded batch.
    const TensorBatch both = TensorBatch::concat({*a, *b}, loader.padding());
    REQUIRE(both.size() == 8);
    const int64_t width = std::max(a->tensor(keys::input_ids).size(1), b->tensor(keys::input_ids).size(1));
    CHECK(both.tensor(keys::input_ids).size(1) == width);
    const auto counts = token_counts(both);
    CHECK(counts.real == ia.real_tokens + ib.real_tokens);
    CHECK(counts.padded == 8 * width);
    for (int64_t r = 0; r < 8; ++r) {
      const auto& src = r < 4 ? *a : *b;
      const int64_t i = r % 4;
      const auto ids = row_of(src.tensor(keys::input_ids), i), mask = row_of(src.tensor(keys::attention_mask), i);
      const auto got = row_of(both.tensor(keys::input_ids), r), got_mask = row_of(both.tensor(keys::attention_mask), r);
      const auto shift = static_cast<size_t>(width) - ids.size();  // left padding grows on the left
      for (size_t t = 0; t < shift; ++t) {
        CHECK(got[t] == data->pad_id());
        CHECK(got_mask[t] == 0);
      }
      CHECK(std::vector<int64_t>(got.begin() + static_cast<std::ptrdiff_t>(shift), got.end()) == ids);
      CHECK(std::vector<int64_t>(got_mask.begin() + static_cast<std::ptrdiff_t>(shift), got_mask.end()) == mask);
      CHECK(both.column(keys::uid)[static_cast<size_t>(r)] == src.column(keys::uid)[static_cast<size_t>(i)]);
    }
    // chunk / slice / reorder: every fact travels with its rows (tensors, columns), none is left in
    // metadata describing the whole batch
    const auto halves = both.chunk(2);
    CHECK(token_counts(halves[0]).real == ia.real_tokens);
    CHECK(token_counts(halves[1]).real == ib.real_tokens);
    CHECK(halves[0].meta().empty());
    const auto picked = both.reorder(at::tensor(std::vector<int64_t>{7, 0}, at::kLong));
    CHECK(token_counts(picked).real ==
          both.tensor(keys::attention_mask)[7].sum().item<int64_t>() +
              both.tensor(keys::attention_mask)[0].sum().item<int64_t>());
    CHECK(picked.column(keys::uid) == Column{both.column(keys::uid)[7], both.column(keys::uid)[0]});
  }
}
