// TensorBatch: every operation and its error cases, against values written out by hand.

#include <hybridrl/core/tensor_batch.hpp>

#include <array>
#include <span>
#include <string>
#include <string_view>
#include <vector>
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using hybridrl::Column;
using hybridrl::Error;
using hybridrl::TensorBatch;
namespace keys = hybridrl::keys;

namespace {

// 4 samples: x = [[0,1],[2,3],[4,5],[6,7]], y = [10,11,12,13], column id = "a".."d".
TensorBatch sample_batch() {
  return TensorBatch({{"x", at::arange(8, at::kLong).view({4, 2})}, {"y", at::arange(10, 14, at::kLong)}},
                     {{"id", Column{"a", "b", "c", "d"}}}, {{"step", 3}});
}

std::vector<int64_t> as_vec(const at::Tensor& t) {
  auto c = t.to(at::kLong).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

std::vector<std::string> ids(const TensorBatch& b) {
  std::vector<std::string> out;
  for (const auto& v : b.column("id")) out.push_back(v.get<std::string>());
  return out;
}

// Runs f, requires it to throw hybridrl::Error whose message contains `needle`.
template <class F>
void check_error(F&& f, const std::string& needle) {
  try {
    f();
    FAIL("expected hybridrl::Error containing: " << needle);
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find(needle) != std::string::npos);
    CHECK(!e.fix().empty());
  }
}

}  // namespace

TEST_SUITE("core/tensor_batch") {
  TEST_CASE("construction, access and size checks") {
    auto b = sample_batch();
    CHECK(b.size() == 4);
    CHECK(b.has_tensor("x"));
    CHECK_FALSE(b.has_tensor("id"));
    CHECK(b.has_column("id"));
    CHECK(b.tensor_keys() == std::vector<std::string>{"x", "y"});
    CHECK(b.meta()["step"] == 3);
    check_error([&] { (void)b.tensor("z"); }, "no tensor 'z' (produced by not a cross-axis key (core/keys.hpp); tensors: [x, y])");
    check_error([&] { (void)b.column("z"); }, "no column 'z'");
    check_error([&] { b.set("bad", at::zeros({3})); }, "'bad' has 3 rows but the batch has 4");
    check_error([&] { b.set_column("bad", Column{1, 2}); }, "'bad' has 2 rows");
    check_error([&] { b.set("scalar", at::scalar_tensor(1.0)); }, "0-d scalar");
    check_error([&] { b.set_meta(nlohmann::json::array()); }, "must be a JSON object");
    b.erase("x").erase("y").erase("id");
    CHECK(b.empty());
    CHECK(b.size() == 0);
    b.set("z", at::zeros({7}));  // an emptied batch takes a new size
    CHECK(b.size() == 7);
  }

  TEST_CASE("select shares tensors and keeps meta") {
    auto b = sample_batch();
    auto s = b.select({"y"}, {"id"});
    CHECK(s.tensor_keys() == std::vector<std::string>{"y"});
    CHECK(s.tensor("y").is_same(b.tensor("y")));
    CHECK(ids(s) == std::vector<std::string>{"a", "b", "c", "d"});
    CHECK(s.meta()["step"] == 3);
    check_error([&] { (void)b.select({"nope"}); }, "no tensor 'nope'");
  }

  TEST_CASE("union_with merges and rejects conflicts") {
    auto b = sample_batch();
    TensorBatch extra({{"z", at::ones({4})}, {"y", at::arange(10, 14, at::kLong)}}, {}, {{"lr", 1}});
    b.union_with(extra);  // equal 'y' values: allowed
    CHECK(b.tensor_keys() == std::vector<std::string>{"x", "y", "z"});
    CHECK(b.meta()["lr"] == 1);
    check_error([&] { b.union_with(TensorBatch({{"y", at::zeros({4}, at::kLong)}})); },
                "tensor 'y' exists in both batches with different values");
    check_error([&] { b.union_with(TensorBatch({{"w", at::zeros({5})}})); },
                "batch sizes differ (4 vs 5)");
    check_error([&] { b.union_with(TensorBatch({}, {{"id", Column{"a", "b", "c", "X"}}})); },
                "column 'id' exists in both");
    check_error([&] { b.union_with(TensorBatch({{"q", at::zeros({4})}}, {}, {{"step", 4}})); },
                "metadata 'step' differs (3 vs 4)");
    CHECK_FALSE(b.has_tensor("q"));  // a failed union changes nothing
    // metadata strings set from C++ need not be UTF-8: the message is still an Error (dump() throws)
    TensorBatch bytes({{"q", at::zeros({4})}}, {}, {{"tag", "\xff"}});
    check_error([&] { bytes.union_with(TensorBatch({{"r", at::zeros({4})}}, {}, {{"tag", "\xfe"}})); },
                "metadata 'tag' differs");
    check_error([&] { (void)TensorBatch::concat({bytes, TensorBatch({{"q", at::zeros({4})}}, {}, {{"tag", "\xfe"}})}); },
                "metadata 'tag' differs");
  }

  TEST_CASE("slice, split and chunk") {
    auto b = sample_batch();
    auto s = b.slice(1, 4, 2);
    CHECK(as_vec(s.tensor("y")) == std::vector<int64_t>{11, 13});
    CHECK(ids(s) == std::vector<std::string>{"b", "d"});
    auto parts = b.split(3);
    REQUIRE(parts.size() == 2);
    CHECK(as_vec(parts[0].tensor("y")) == std::vector<int64_t>{10, 11, 12});
    CHECK(as_vec(parts[1].tensor("x")) == std::vector<int64_t>{6, 7});
    auto chunks = b.chunk(2);
    REQUIRE(chunks.size() == 2);
    CHECK(ids(chunks[1]) == std::vector<std::string>{"c", "d"});
    check_error([&] { (void)b.chunk(3); }, "4 samples do not split into 3 equal chunks (4 % 3 = 1)");
    auto empty_chunks = b.slice(0, 0).chunk(3);  // an empty batch splits into empty parts
    REQUIRE(empty_chunks.size() == 3);
    for (const auto& c : empty_chunks) CHECK(c.size() == 0);
    check_error([&] { (void)b.chunk(0); }, "must be >= 1");
    check_error([&] { (void)b.split(0); }, "must be >= 1");
    check_error([&] { (void)b.slice(2, 5); }, "[2, 5) is outside a batch of 4");
    check_error([&] { (void)b.slice(0, 2, 0); }, "step must be >= 1");
  }

  TEST_CASE("concat is the inverse of split") {
    auto b = sample_batch();
    auto back = TensorBatch::concat(b.split(3));
    CHECK(back.tensor("x").equal(b.tensor("x")));
    CHECK(ids(back) == ids(b));
    CHECK(back.meta() == b.meta());
    check_error([&] { (void)TensorBatch::concat({}); }, "no batches given");
    check_error([&] { (void)TensorBatch::concat({b, b.select({"x"}, {"id"})}); }, "part 1 has keys [x]");
    auto other = b;
    other.set_meta("step", 9);
    check_error([&] { (void)TensorBatch::concat({b, other}); }, "metadata 'step' differs");
    auto wide = b.select({"y"}, {"id"});
    auto wide2 = TensorBatch({{"y", at::zeros({2, 3}, at::kLong)}}, {{"id", Column{"e", "f"}}}, {{"step", 3}});
    check_error([&] { (void)TensorBatch::concat({wide, wide2}); }, "tensor 'y' of part 1 is [2, 3]");
  }

  TEST_CASE("repeat interleaved and tiled") {
    auto b = sample_batch().slice(0, 2);  // ids a, b
    auto inter = b.repeat(3, true);
    CHECK(ids(inter) == std::vector<std::string>{"a", "a", "a", "b", "b", "b"});
    CHECK(as_vec(inter.tensor("y")) == std::vector<int64_t>{10, 10, 10, 11, 11, 11});
    auto tiled = b.repeat(2, false);
    CHECK(ids(tiled) == std::vector<std::string>{"a", "b", "a", "b"});
    CHECK(as_vec(tiled.tensor("x")) == std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3});
    check_error([&] { (void)b.repeat(0); }, "n must be >= 1");
  }

  TEST_CASE("reorder permutes and gathers; bad indices throw") {
    auto b = sample_batch();
    auto r = b.reorder(at::tensor(std::vector<int64_t>{3, 0, 0}));
    CHECK(r.size() == 3);
    CHECK(ids(r) == std::vector<std::string>{"d", "a", "a"});
    CHECK(as_vec(r.tensor("y")) == std::vector<int64_t>{13, 10, 10});
    check_error([&] { (void)b.reorder(at::tensor(std::vector<int64_t>{0, 4})); },
                "index range [0, 4] is outside a batch of 4");
    check_error([&] { (void)b.reorder(at::tensor(std::vector<int64_t>{-1})); }, "outside");
    check_error([&] { (void)b.reorder(at::zeros({2})); }, "1-D int64");
    if (at::hasCUDA()) {  // the GPU machine: tensors on the device, indices on the host or the device
      auto g = b.to(at::Device(at::kCUDA));
      for (const auto& idx : {at::tensor(std::vector<int64_t>{3, 0, 0}),
                              at::tensor(std::vector<int64_t>{3, 0, 0}).to(at::Device(at::kCUDA))}) {
        auto rg = g.reorder(idx);
        CHECK(rg.tensor("y").device().is_cuda());
        CHECK(ids(rg) == std::vector<std::string>{"d", "a", "a"});
        CHECK(as_vec(rg.tensor("y").cpu()) == std::vector<int64_t>{13, 10, 10});
      }
      check_error([&] { (void)g.reorder(at::tensor(std::vector<int64_t>{0, 4}).to(at::Device(at::kCUDA))); },
                  "index range [0, 4] is outside a batch of 4");
    }
  }

  TEST_CASE("pad_to_divisor cycles rows and unpad restores") {
    auto b = sample_batch().slice(0, 3);  // a b c
    auto [padded, pad] = b.pad_to_divisor(4);
    CHECK(pad == 1);
    CHECK(ids(padded) == std::vector<std::string>{"a", "b", "c", "a"});
    auto [padded8, pad8] = b.pad_to_divisor(8);  // needs 5 copies from 3 rows: cycles
    CHECK(pad8 == 5);
    CHECK(ids(padded8) == std::vector<std::string>{"a", "b", "c", "a", "b", "c", "a", "b"});
    CHECK(ids(padded8.unpad(pad8)) == ids(b));
    auto [same, zero] = b.pad_to_divisor(3);
    CHECK(zero == 0);
    CHECK(same.size() == 3);
    check_error([&] { (void)b.pad_to_divisor(0); }, "divisor must be >= 1");
    check_error([&] { (void)b.unpad(4); }, "cannot remove 4 rows from a batch of 3");
    TensorBatch empty;
    CHECK(empty.pad_to_divisor(4).pad_size == 0);  // 0 % 4 == 0: nothing to pad
  }

  TEST_CASE("to(device) moves tensors and keeps columns") {
    auto b = sample_batch().to(at::Device(at::kCPU));
    CHECK(b.tensor("x").device().is_cpu());
    CHECK(ids(b).size() == 4);
    if (at::hasCUDA()) {  // the GPU machine: a real move and back
      auto g = sample_batch().to(at::Device(at::kCUDA));
      CHECK(g.tensor("x").device().is_cuda());
      CHECK(ids(g) == ids(sample_batch()));
      CHECK(at::equal(g.to(at::Device(at::kCPU)).tensor("x"), sample_batch().tensor("x")));
    }
  }

  TEST_CASE("require lists every missing key once, with its stage and producer") {
    auto b = sample_batch();
    b.set(keys::response_mask, at::ones({4, 2}, at::kLong));
    CHECK_NOTHROW(b.require({keys::response_mask}, "update"));
    try {
      b.require({keys::advantages, keys::response_mask, keys::old_log_probs, keys::uid}, "actor update");
      FAIL("expected hybridrl::Error");
    } catch (const Error& e) {
      const std::string what = e.what();
      INFO(what);
      CHECK(what.find("stage 'actor update' needs 3 key(s)") != std::string::npos);
      CHECK(what.find("'advantages' [B, R] float32 (produced by Algorithm::compute_advantages)") != std::string::npos);
      CHECK(what.find("'old_log_probs' [B, T] float32 (produced by policy forward (old log-probs phase))") !=
            std::string::npos);
      CHECK(what.find("'uid' [B] column string (produced by Loader (dataset))") != std::string::npos);
      CHECK(what.find("'response_mask' [") == std::string::npos);  // present: not listed
      CHECK(what.find("[response_mask, x, y]") != std::string::npos);
    }
    // plain names: the producer is looked up in core/keys.hpp
    const std::array<std::string_view, 2> names{"group_ids", "x"};
    check_error([&] { b.require(std::span<const std::string_view>(names), "GRPO advantages"); },
                "stage 'GRPO advantages' needs 1 key(s) the batch lacks: 'group_ids' (produced by "
                "repeat_for_rollout (from the Loader's uid column))");
    // columns satisfy require too
    CHECK_NOTHROW(TensorBatch({}, {{"uid", Column{"a"}}}).require({keys::uid}, "rollout"));
  }

  TEST_CASE("tensor(Key) and column(Key) name the producer of a missing key") {
    const auto b = sample_batch();
    check_error([&] { (void)b.tensor(keys::group_ids); },
                "no tensor 'group_ids' (produced by repeat_for_rollout (from the Loader's uid column);");
    check_error([&] { (void)b.column(keys::uid); }, "no column 'uid' (produced by Loader (dataset);");
    // a plain string that is a cross-axis key finds its producer through keys::find
    check_error([&] { (void)b.tensor("ref_log_probs"); }, "(produced by reference forward;");
    CHECK(as_vec(b.tensor(hybridrl::Key{"y", "[B]", "int64", "test"})) == std::vector<int64_t>{10, 11, 12, 13});
  }

  TEST_CASE("concat with padding: token tensors of different widths, on either side") {
    TensorBatch a({{"input_ids", at::tensor({1, 2}, at::kLong).view({1, 2})}, {"n", at::tensor({1}, at::kLong)}});
    TensorBatch b({{"input_ids", at::tensor({3, 4, 5, 6}, at::kLong).view({1, 4})}, {"n", at::tensor({2}, at::kLong)}});
    check_error([&] { (void)TensorBatch::concat({a, b}); }, "tensor 'input_ids' of part 1 is [1, 4]");
    const auto left = TensorBatch::concat({a, b}, hybridrl::ConcatPadding{hybridrl::PaddingSide::left, {{"input_ids", 9}}});
    CHECK(as_vec(left.tensor("input_ids")) == std::vector<int64_t>{9, 9, 1, 2, 3, 4, 5, 6});
    CHECK(as_vec(left.tensor("n")) == std::vector<int64_t>{1, 2});  // 1-D: untouched
    const auto right = TensorBatch::concat({a, b}, hybridrl::ConcatPadding{});
    CHECK(as_vec(right.tensor("input_ids")) == std::vector<int64_t>{1, 2, 0, 0, 3, 4, 5, 6});
  }
}
