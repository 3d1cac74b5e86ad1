// pack / pack_values / unpack / unpack_sum (data/packing.hpp) on hand-written batches, offline and
// online layouts, gradients; repeat_for_rollout's group ids (data/rollout_batch.hpp).

#include <string>
#include <vector>

#include "hybridrl/data/packing.hpp"
#include "hybridrl/data/rollout_batch.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;

namespace {

at::Tensor longs(std::vector<std::vector<int64_t>> rows) {
  const auto w = static_cast<int64_t>(rows.front().size());
  std::vector<int64_t> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  return at::tensor(flat, at::kLong).view({static_cast<int64_t>(rows.size()), w});
}

std::vector<int64_t> vec(const at::Tensor& t) {
  auto c = t.to(at::kLong).contiguous().view({-1});
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

std::vector<double> dvec(const at::Tensor& t) {
  auto c = t.to(at::kDouble).contiguous().view({-1});
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

// B = 3, T = 4: a right-padded row of 4 tokens, one of 1 token, a left-padded one of 3.
TensorBatch offline_batch() {
  return TensorBatch({{"input_ids", longs({{11, 12, 13, 14}, {21, 0, 0, 0}, {0, 31, 32, 33}})},
                      {"attention_mask", longs({{1, 1, 1, 1}, {1, 0, 0, 0}, {0, 1, 1, 1}})},
                      {"response_mask", longs({{0, 0, 1, 1}, {0, 0, 0, 0}, {0, 0, 1, 1}})}},
                     {{"uid", Column{"a", "b", "c"}}});
}

}  // namespace

TEST_SUITE("data/packing") {
  TEST_CASE("pack by hand: best fit puts the 1-token sequence beside the 4-token one") {
    // Lengths 4, 1, 3 into rows of 5, best-fit decreasing: 4 → row 0 (room 1), 3 → row 1
    // (room 2), 1 → the row with least room that fits, row 0.
    const auto p = pack(offline_batch(), 5);
    CHECK(p.roles == std::vector<std::string>{""});
    CHECK(p.units == 3);
    CHECK(p.widths == std::vector<int64_t>{4});
    CHECK(vec(p.rows.tensor(keys::input_ids)) == std::vector<int64_t>{11, 12, 13, 14, 21, 31, 32, 33, 0, 0});
    CHECK(vec(p.rows.tensor(keys::position_ids)) == std::vector<int64_t>{0, 1, 2, 3, 0, 0, 1, 2, 0, 0});
    CHECK(vec(p.rows.tensor(keys::attention_mask)) == std::vector<int64_t>{1, 1, 1, 1, 1, 1, 1, 1, 0, 0});
    CHECK(vec(p.rows.tensor(keys::segment_ids)) == std::vector<int64_t>{0, 0, 0, 0, 1, 2, 2, 2, -1, -1});
    // row 2's response is its last two tokens (32, 33): packed row 1, columns 1 and 2
    CHECK(vec(p.rows.tensor(keys::response_mask)) == std::vector<int64_t>{0, 0, 1, 1, 0, 0, 1, 1, 0, 0});
    CHECK((p.rows.tensor(keys::cu_seqlens).scalar_type() == at::kInt));
    CHECK(vec(p.rows.tensor(keys::cu_seqlens)) == std::vector<int64_t>{0, 4, 5, 0, 3, 3});
    CHECK(vec(p.sequence_row) == std::vector<int64_t>{0, 0, 1});
    CHECK(vec(p.sequence_offset) == std::vector<int64_t>{0, 4, 0});
    CHECK(vec(p.sequence_length) == std::vector<int64_t>{4, 1, 3});
    CHECK(vec(p.sequence_unit) == std::vector<int64_t>{0, 1, 2});
    CHECK(vec(p.sequence_start) == std::vector<int64_t>{0, 0, 1});
    CHECK(p.real_tokens() == 8);
    CHECK(p.unused_fraction() == doctest::Approx(0.2));  // 2 of 10 positions
  }

  TEST_CASE("unpack, unpack_sum and pack_values invert each other; gradients reach the packed values") {
    const auto p = pack(offline_batch(), 5);
    // packed value at (r, l) = 100 r + l
    auto v = (at::arange(2, at::kDouble).unsqueeze(1) * 100 + at::arange(5, at::kDouble)).requires_grad_(true);
    const auto u = unpack(p, v);
    // s0 = row 0 cols 0..3 → row 0 cols 0..3; s1 = row 0 col 4 → row 1 col 0; s2 = row 1 cols 0..2
    // → row 2 cols 1..3 (it was left-padded)
    CHECK(dvec(u) == std::vector<double>{0, 1, 2, 3, 4, 0, 0, 0, 0, 100, 101, 102});
    const auto sums = unpack_sum(p, v);
    CHECK(dvec(sums) == std::vector<double>{6, 4, 303});
    sums.sum().backward();
    CHECK(dvec(v.grad()) == std::vector<double>{1, 1, 1, 1, 1, 1, 1, 1, 0, 0});  // real tokens only
    // per-sequence values 10 b + t packed into the rows
    const auto x = at::arange(3, at::kDouble).unsqueeze(1) * 10 + at::arange(4, at::kDouble);
    const auto packed = pack_values(p, x);
    CHECK(dvec(packed) == std::vector<double>{0, 1, 2, 3, 10, 21, 22, 23, 0, 0});
    CHECK(unpack(p, packed).equal(x * offline_batch().tensor("attention_mask").to(at::kDouble)));
  }

  TEST_CASE("online layout: a [B, R] response_mask is right-aligned to input_ids [B, P + R]") {
    // prompts left-padded to P = 2, responses right-padded to R = 3
    TensorBatch b({{"input_ids", longs({{0, 7, 8, 9, 0}, {5, 6, 4, 0, 0}})},
                   {"attention_mask", longs({{0, 1, 1, 1, 0}, {1, 1, 1, 0, 0}})},
                   {"response_mask", longs({{1, 1, 0}, {1, 0, 0}})}});
    const auto p = pack(b, 6);  // lengths 3 and 3 share one row
    CHECK(vec(p.rows.tensor(keys::input_ids)) == std::vector<int64_t>{7, 8, 9, 5, 6, 4});
    CHECK(vec(p.rows.tensor(keys::response_mask)) == std::vector<int64_t>{0, 1, 1, 0, 0, 1});
    CHECK(vec(p.rows.tensor(keys::position_ids)) == std::vector<int64_t>{0, 1, 2, 0, 1, 2});
    // rollout log-probs [B, R]: row 0's tokens sit at response columns -1, 0, 1; row 1's at -2, -1, 0
    const auto rl = at::tensor(std::vector<double>{.1, .2, .3, .4, .5, .6}).view({2, 3});
    const auto packed = pack_values(p, rl);
    CHECK(dvec(packed) == std::vector<double>{0, .1, .2, 0, 0, .4});
    // back to [B, T], then the response columns
    CHECK(dvec(unpack(p, packed).slice(1, 2)) == std::vector<double>{.1, .2, 0, .4, 0, 0});
  }

  TEST_CASE("pack: rows are trimmed to the fullest one's tokens, not padded to row_length") {
    // Lengths 4, 1, 3 fit one row of 16: the row is 8 wide (4 + 1 + 3), no padding column.
    const auto p = pack(offline_batch(), 16);
    CHECK(p.rows.size() == 1);
    CHECK(p.row_length == 8);
    CHECK(p.rows.tensor(keys::input_ids).sizes().vec() == std::vector<int64_t>{1, 8});
    CHECK(vec(p.rows.tensor(keys::input_ids)) == std::vector<int64_t>{11, 12, 13, 14, 21, 31, 32, 33});
    CHECK(vec(p.rows.tensor(keys::cu_seqlens)) == std::vector<int64_t>{0, 4, 5, 8});
    // two rows of 5 and 3 tokens: both 5 wide
    const auto q = pack(offline_batch(), 5);
    CHECK(q.row_length == 5);
    CHECK(q.rows.tensor(keys::segment_ids).sizes().vec() == std::vector<int64_t>{2, 5});
  }

  TEST_CASE("pack: roles of DPO pairs pack together; errors name the problem") {
    auto base = offline_batch();
    TensorBatch pairs;
    for (const std::string role : {"chosen_", "rejected_"}) {
      for (const std::string k : {"input_ids", "attention_mask", "response_mask"}) pairs.set(role + k, base.tensor(k));
    }
    const auto p = pack(pairs, 8);
    CHECK(p.roles == std::vector<std::string>{"chosen_", "rejected_"});
    CHECK(p.sequences() == 6);
    CHECK(vec(p.sequence_role) == std::vector<int64_t>{0, 1, 0, 1, 0, 1});
    CHECK(vec(p.sequence_unit) == std::vector<int64_t>{0, 0, 1, 1, 2, 2});
    const auto ones = at::ones({p.rows.size(), 8}, at::kDouble) * p.rows.tensor(keys::attention_mask).to(at::kDouble);
    CHECK(dvec(unpack_sum(p, ones, "rejected_")) == std::vector<double>{4, 1, 3});
    CHECK_THROWS_WITH_AS((void)unpack(p, ones, "kl_"), doctest::Contains("no role 'kl_'"), Error);
    CHECK_THROWS_WITH_AS((void)pack(base, 3), doctest::Contains("length 4, outside [1, row_length = 3]"), Error);
    TensorBatch holes({{"input_ids", longs({{1, 2, 3}})}, {"attention_mask", longs({{1, 0, 1}})}});
    CHECK_THROWS_WITH_AS((void)pack(holes, 4), doctest::Contains("padding between its tokens"), Error);
    CHECK_THROWS_WITH_AS((void)pack(TensorBatch({{"x", longs({{1}})}}), 4),
                         doctest::Contains("no input_ids of any role"), Error);
  }

  TEST_CASE("repeat_for_rollout: interleaved rows, group ids from uid in order of first appearance") {
    TensorBatch prompts({{"input_ids", longs({{1, 2}, {3, 4}, {5, 6}})}}, {{"uid", Column{"x", "y", "x"}}});
    const auto out = repeat_for_rollout(prompts, 2);
    CHECK(out.size() == 6);
    CHECK(vec(out.tensor(keys::input_ids)) == std::vector<int64_t>{1, 2, 1, 2, 3, 4, 3, 4, 5, 6, 5, 6});
    CHECK((out.tensor(keys::group_ids).scalar_type() == at::kLong));
    // "x" first seen at row 0 → 0, "y" → 1; row 2 has uid "x" again → 0
    CHECK(vec(out.tensor(keys::group_ids)) == std::vector<int64_t>{0, 0, 1, 1, 0, 0});
    CHECK(out.column(keys::uid) == Column{"x", "x", "y", "y", "x", "x"});
    CHECK(vec(repeat_for_rollout(TensorBatch({{"input_ids", longs({{1}, {2}})}}, {{"uid", Column{7, 3}}}), 1)
                  .tensor(keys::group_ids)) == std::vector<int64_t>{0, 1});
    try {
      (void)repeat_for_rollout(TensorBatch({{"input_ids", longs({{1}})}}), 4);
      FAIL("expected an error");
    } catch (const Error& e) {
      const std::string what = e.what();
      CHECK(what.find("'uid'") != std::string::npos);
      CHECK(what.find("repeat_for_rollout") != std::string::npos);
      CHECK(what.find("Loader (dataset)") != std::string::npos);
    }
  }
}
