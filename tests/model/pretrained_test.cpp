// Hugging Face checkpoints: logits equal transformers' (fixtures made by
// tests/fixtures/make_model_fixtures.py), safetensors errors, save → load round trips.
#include <torch/cuda.h>
#include <torch/nn/module.h>

#include <ftw.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>

#include <sys/stat.h>
#include <unistd.h>

#include "hybridrl/model/model.hpp"
#include "hybridrl/rollout/naive/dense_kv_cache.hpp"
#include "../support/tensors.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;
using namespace hybridrl::testing;
namespace fs = std::filesystem;

namespace {

const std::string kModels = std::string(HYBRIDRL_FIXTURES_DIR) + "/models";
const std::vector<int64_t> kLengths = {12, 9, 5};  // as in make_model_fixtures.py


/// Max abs difference over the positions where `mask` is 1.
double masked_diff(const at::Tensor& a, const at::Tensor& b, const at::Tensor& mask) {
  auto m = mask.to(at::kBool);
  return (a.index({m}) - b.index({m})).abs().max().item<double>();
}

/// Removes a directory tree with POSIX nftw, not std::filesystem::remove_all: the pip wheels of
/// LibTorch 2.x export a broken copy of remove_all from libtorch.so that programs can bind to
/// (docs/development.md, "LibTorch 1.13 and 2.x").
inline void remove_tree(const fs::path& p) {
  ::nftw(p.c_str(), [](const char* f, const struct stat*, int, struct FTW*) { return ::remove(f); }, 16,
         FTW_DEPTH | FTW_PHYS);
}

/// A fresh scratch directory, removed at scope exit.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    path = fs::temp_directory_path() / ("hybridrl_model_" + tag + "_" + std::to_string(::getpid()));
    remove_tree(path);
    fs::create_directories(path);
  }
  ~TempDir() { remove_tree(path); }
  [[nodiscard]] std::string str() const { return path.string(); }
};

/// Copy of fixture `name` in a scratch directory.
TempDir copy_fixture(const std::string& name, const std::string& tag) {
  TempDir d(tag);
  for (const auto& e : fs::directory_iterator(kModels + "/" + name)) {
    fs::copy_file(e.path(), d.path / e.path().filename());
    fs::permissions(d.path / e.path().filename(), fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::add);
  }
  return d;
}


void write_file(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << s;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// 64-bit FNV-1a of a file's bytes as 16 hex digits (make_model_fixtures.py's fnv1a64).
std::string fnv1a64(const std::string& path) {
  const auto bytes = read_file(path);
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const unsigned char b : bytes) h = (h ^ b) * 0x100000001b3ULL;
  return fmt::format("{:016x}", h);
}

/// A safetensors file from a raw header string and `data` bytes.
void write_safetensors_raw(const fs::path& p, const std::string& header, const std::string& data) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  write_file(p, bytes + header + data);
}

/// The Error message of opening `header` + `data` as a safetensors file.
std::string safetensors_error(const TempDir& d, const std::string& header, const std::string& data) {
  const auto p = d.path / "raw.safetensors";
  write_safetensors_raw(p, header, data);
  return error_of([&] { SafetensorsFile f(p.string()); });
}

/// A minimal valid config.json object (Llama, 2 heads).
nlohmann::json small_config() {
  return nlohmann::json::parse(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 100,
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
    "num_key_value_heads": 2})");
}

std::string config_error(const nlohmann::json& j) {
  return error_of([&] { config_from_json(j, "x/config.json"); });
}

struct FixtureDiffs {
  double unpadded = 0, left = 0, right = 0, packed = 0, decode = 0;
};

FixtureDiffs compare_with_hf(CausalLM& m, const std::map<std::string, at::Tensor>& ref) {
  torch::NoGradGuard g;
  FixtureDiffs d;
  auto ids = ref.at("unpadded.input_ids");
  auto want = ref.at("unpadded.logits");
  d.unpadded = max_diff(m->forward(ids).to(at::kFloat), want);
  for (const char* side : {"left", "right"}) {
    const std::string s = side;
    auto mask = ref.at(s + ".attention_mask");
    auto got = m->forward(ref.at(s + ".input_ids"), ForwardArgs{}.attention_mask(mask)).to(at::kFloat);
    (s == "left" ? d.left : d.right) = masked_diff(got, ref.at(s + ".logits"), mask);
  }
  // packed: the three sequences (row b truncated to kLengths[b]) in one row
  std::vector<at::Tensor> parts;
  std::vector<int> cu = {0};
  for (size_t b = 0; b < kLengths.size(); ++b) {
    parts.push_back(ids[static_cast<int64_t>(b)].narrow(0, 0, kLengths[b]));
    cu.push_back(cu.back() + static_cast<int>(kLengths[b]));
  }
  auto packed = m->forward(at::cat(parts).unsqueeze(0), ForwardArgs{}.cu_seqlens(torch::tensor(cu, at::kInt)));
  for (size_t b = 0; b < kLengths.size(); ++b) {
    auto got = packed[0].narrow(0, cu[b], kLengths[b]).to(at::kFloat);
    d.packed = std::max(d.packed, max_diff(got, want[static_cast<int64_t>(b)].narrow(0, 0, kLengths[b])));
  }
  // decode: prefill 5 tokens, then one at a time
  auto cache = KVCache::allocate(m->config(), ids.size(0), ids.size(1), m->parameters().front().options());
  auto first = forward_decode(m, ids.narrow(1, 0, 5), cache).to(at::kFloat);
  d.decode = max_diff(first, want.narrow(1, 0, 5));
  for (int64_t t = 5; t < ids.size(1); ++t) {
    auto step = forward_decode(m, ids.narrow(1, t, 1), cache).to(at::kFloat);
    d.decode = std::max(d.decode, max_diff(step.squeeze(1), want.select(1, t)));
  }
  return d;
}

}  // namespace

TEST_SUITE("model/pretrained") {
  TEST_CASE("tiny HF checkpoints: our logits equal transformers' fp32 logits") {
    // qwen2_swa: Qwen2 with use_sliding_window, layer 0 full and layer 1 a 4-key window over 12 tokens
    // llama_variant: rms_norm_eps 1e-5, head_dim 24 != hidden/heads, one KV head, attention and MLP
    // biases, linear rope: a loader that ignored any of them would miss by far more than 2e-5
    for (const std::string name : {"llama", "mistral", "qwen2", "qwen2_swa", "llama_variant"}) {
      CAPTURE(name);
      const auto dir = kModels + "/" + name;
      REQUIRE_MESSAGE(fs::exists(dir + "/config.json"),
                      "fixtures missing: run tests/fixtures/make_model_fixtures.py --out tests/fixtures/models");
      auto m = load_causal_lm(dir);
      m->eval();
      auto ref = load_safetensors(dir + "/hf_logits.safetensors");
      auto d = compare_with_hf(m, ref);
      MESSAGE(name << ": max abs diff vs HF  unpadded " << d.unpadded << "  left-padded " << d.left
                   << "  right-padded " << d.right << "  packed " << d.packed << "  kv-decode " << d.decode);
      // observed 2e-6 .. 8e-6 (fp32 summation order): 2e-5 leaves headroom, a 10x eps error does not fit
      CHECK(d.unpadded <= 2e-5);
      CHECK(d.left <= 2e-5);
      CHECK(d.right <= 2e-5);
      CHECK(d.packed <= 2e-5);
      CHECK(d.decode <= 2e-5);
    }
  }

  TEST_CASE("config: architectures, tied embeddings, llama3 rope, sliding window, qkv bias") {
    auto llama = load_config(kModels + "/llama");
    CHECK(llama.architecture == "LlamaForCausalLM");
    CHECK(llama.rope_scaling.type == "llama3");
    CHECK(llama.rope_scaling.original_max_position_embeddings == 64);
    CHECK_FALSE(llama.tie_word_embeddings);
    auto mistral = load_config(kModels + "/mistral");
    CHECK(mistral.tie_word_embeddings);
    CHECK(mistral.sliding_window == 6);
    CHECK(mistral.rope_theta == 1e6);
    auto qwen = load_config(kModels + "/qwen2");
    CHECK(qwen.qkv_bias);
    CHECK(qwen.dtype == "bfloat16");
    CHECK(qwen.num_key_value_heads == 2);
    CHECK_FALSE(qwen.sliding_window.has_value());  // use_sliding_window false
    CHECK_FALSE(qwen.layer_window(1).has_value());
    auto swa = load_config(kModels + "/qwen2_swa");
    CHECK(swa.sliding_window == 4);
    CHECK(swa.layer_types == std::vector<std::string>{"full_attention", "sliding_attention"});
    CHECK_FALSE(swa.layer_window(0).has_value());
    CHECK(swa.layer_window(1) == 4);
    CHECK(swa.mixed_windows());
    auto variant = load_config(kModels + "/llama_variant");
    CHECK(variant.rms_norm_eps == 1e-5);
    CHECK(variant.head_dim == 24);  // explicit, not hidden_size / heads = 16
    CHECK(variant.num_key_value_heads == 1);
    CHECK(variant.attention_bias);
    CHECK(variant.mlp_bias);
    CHECK(variant.rope_scaling.type == "linear");
    CHECK(variant.rope_scaling.factor == 2.0);
    CHECK(variant.rope_theta == 5e5);
    CHECK(variant.max_position_embeddings == 256);
    CHECK(mistral.layer_window(0) == 6);  // Mistral: every layer
    CHECK(mistral.layer_window(1) == 6);
    CHECK_FALSE(mistral.mixed_windows());
  }

  TEST_CASE("Qwen2 sliding window: the window changes the logits, and layer_types follows max_window_layers") {
    // the fixture's window bites: the same weights with full attention give other logits than HF's
    auto ref = load_safetensors(kModels + "/qwen2_swa/hf_logits.safetensors");
    auto j = nlohmann::json::parse(read_file(kModels + "/qwen2_swa/config.json"));
    j["use_sliding_window"] = false;
    {
      torch::NoGradGuard g;
      CausalLM full(config_from_json(j));
      auto windowed = load_causal_lm(kModels + "/qwen2_swa");
      for (const auto& p : windowed->named_parameters()) full->named_parameters()[p.key()].copy_(p.value());
      const auto ids = ref.at("unpadded.input_ids");
      CHECK(max_diff(windowed->forward(ids), ref.at("unpadded.logits")) <= 1e-4);
      CHECK(max_diff(full->forward(ids), ref.at("unpadded.logits")) > 1e-2);
      // the first 4 positions see no more than the window either way
      CHECK(max_diff(full->forward(ids.narrow(1, 0, 4)), ref.at("unpadded.logits").narrow(1, 0, 4)) <= 1e-4);
    }
    // without layer_types, transformers' rule: layers >= max_window_layers slide
    j = nlohmann::json::parse(read_file(kModels + "/qwen2_swa/config.json"));
    j.erase("layer_types");
    j["num_hidden_layers"] = 4;
    j["max_window_layers"] = 3;
    auto c = config_from_json(j);
    CHECK(c.layer_types ==
          std::vector<std::string>{"full_attention", "full_attention", "full_attention", "sliding_attention"});
    j["max_window_layers"] = 0;
    CHECK_FALSE(config_from_json(j).mixed_windows());  // all slide
    CHECK(config_from_json(j).layer_window(0) == 4);
    j["use_sliding_window"] = false;  // off: no window anywhere, whatever sliding_window says
    CHECK_FALSE(config_from_json(j).layer_window(3).has_value());
    CHECK(config_to_json(config_from_json(j))["sliding_window"] == 4);  // the user's unused value kept
  }

  TEST_CASE("stop ids: config.json's eos_token_id list, replaced by generation_config.json's") {
    auto qwen = load_config(kModels + "/qwen2_chat");  // Qwen2.5-Instruct's shape
    CHECK(qwen.eos_token_id == 2);
    CHECK(qwen.eos_token_ids == std::vector<int64_t>{2, 0});  // generation_config.json: <|im_end|>, <|endoftext|>
    CHECK(load_config(kModels + "/qwen2_chat/config.json").eos_token_ids == std::vector<int64_t>{2, 0});
    auto j = small_config();
    j["eos_token_id"] = {7, 9};  // Llama-3.1's config.json form
    auto c = config_from_json(j);
    CHECK(c.eos_token_id == 7);
    CHECK(c.eos_token_ids == std::vector<int64_t>{7, 9});
    CHECK(config_to_json(c)["eos_token_id"] == nlohmann::json({7, 9}));  // written back as a list
    j["eos_token_id"] = 5;
    CHECK(config_from_json(j).eos_token_ids == std::vector<int64_t>{5});
    j["eos_token_id"] = {5, 100};
    CHECK(config_error(j).find("eos_token_id 100 lies outside the vocabulary [0, 100)") != std::string::npos);
    j["eos_token_id"] = {5, "x"};
    CHECK(config_error(j).find("eos_token_id = [5, \"x\"] is not a token id or a list of them") != std::string::npos);
    TempDir d("gencfg");
    j["eos_token_id"] = 5;
    write_file(d.path / "config.json", j.dump());
    write_file(d.path / "generation_config.json", R"({"eos_token_id": [5, 6], "do_sample": true})");
    CHECK(load_config(d.str()).eos_token_ids == std::vector<int64_t>{5, 6});
    write_file(d.path / "generation_config.json", R"({"eos_token_id": [5, 600]})");
    auto err = error_of([&] { load_config(d.str()); });
    CHECK(err.find("generation_config.json': eos_token_id 600 lies outside the vocabulary") != std::string::npos);
    write_file(d.path / "generation_config.json", "{not json");
    CHECK(error_of([&] { load_config(d.str()); }).find("generation_config.json' is not a JSON object") != std::string::npos);
  }

  TEST_CASE("config: transformers 4.x spelling (rope_theta + rope_scaling) reads and writes back") {
    auto j = nlohmann::json::parse(R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
      "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
      "num_attention_heads": 4, "num_key_value_heads": 1, "rope_theta": 500000.0,
      "rope_scaling": {"type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192},
      "torch_dtype": "bfloat16", "tie_word_embeddings": true, "custom_field": 7})");
    auto c = config_from_json(j);
    CHECK(c.rope_theta == 500000.0);
    CHECK(c.rope_scaling.type == "llama3");
    CHECK(c.rope_scaling.factor == 32.0);
    CHECK(c.head_dim == 8);
    CHECK(c.dtype == "bfloat16");
    auto out = config_to_json(c);
    CHECK(out["rope_theta"] == 500000.0);
    CHECK(out["rope_scaling"]["rope_type"] == "llama3");
    CHECK_FALSE(out.contains("rope_parameters"));
    CHECK(out["torch_dtype"] == "bfloat16");
    CHECK(out["custom_field"] == 7);
    auto again = config_from_json(out);
    CHECK(again.rope_scaling.original_max_position_embeddings == 8192);
    CHECK(again.tie_word_embeddings);
    j["rope_scaling"]["type"] = "yarn";
    CHECK(error_of([&] { config_from_json(j, "x/config.json"); }).find("rope_scaling.rope_type = 'yarn'") != std::string::npos);
    j.erase("hidden_size");
    CHECK(error_of([&] { config_from_json(j, "x/config.json"); }).find("x/config.json") != std::string::npos);
  }

  TEST_CASE("bf16 load: logits on transformers' bf16 noise floor (HF bf16 CPU logits in the fixture)") {
    torch::NoGradGuard g;
    auto ref = load_safetensors(kModels + "/qwen2/hf_logits.safetensors");
    auto ref16 = load_safetensors(kModels + "/qwen2/hf_bf16_logits.safetensors");
    auto m = load_causal_lm(kModels + "/qwen2", LoadOptions{}.dtype(at::kBFloat16));
    CHECK((m->parameters().front().scalar_type() == at::kBFloat16));
    for (const std::string k : {"unpadded", "left", "right"}) {
      CAPTURE(k);
      const auto mask = ref.at(k + ".attention_mask").to(at::kBool);
      auto got = m->forward(ref.at(k + ".input_ids"), ForwardArgs{}
                                                          .attention_mask(ref.at(k + ".attention_mask"))
                                                          .position_ids(ref.at(k + ".position_ids")))
                     .to(at::kFloat)
                     .index({mask});
      const auto fp32 = ref.at(k + ".logits").index({mask});
      const auto hf16 = ref16.at(k + ".logits").index({mask});
      const double ours_vs_hf16 = (got - hf16).abs().mean().item<double>();
      const double floor = (hf16 - fp32).abs().mean().item<double>();    // HF bf16's own error
      const double ours_vs_fp32 = (got - fp32).abs().mean().item<double>();
      MESSAGE(k << ": mean |ours - HF bf16| " << ours_vs_hf16 << ", |ours - fp32| " << ours_vs_fp32
                << ", |HF bf16 - fp32| " << floor);
      // measured (LibTorch 1.13 CPU vs transformers 5.24 on torch 2.15): |ours - fp32| = 0.96 x the
      // floor; RMSNorm, softmax or rope tables in bf16 (instead of fp32, as HF) add an error of the
      // floor's own size to it. |ours - HF bf16| depends on the CPU's bf16 GEMM: 0.70 x the floor
      // where both sides' roundings agree (an AVX-512 machine), 1.02 x on an AVX2-only AMD EPYC
      // (12-06); two bf16 results each one floor from fp32 with independent roundings are about
      // sqrt(2) floors apart, the bound here
      CHECK(ours_vs_fp32 <= 1.1 * floor);
      CHECK(ours_vs_hf16 <= std::sqrt(2.0) * floor);
      CHECK((got.argmax(-1) == hf16.argmax(-1)).to(at::kFloat).mean().item<double>() >= 0.97);
    }
  }

  TEST_CASE("save → load round trip: single, sharded and bf16; critic") {
    torch::NoGradGuard g;
    for (const std::string name : {"llama", "mistral", "qwen2"}) {
      CAPTURE(name);
      auto m = load_causal_lm(kModels + "/" + name);
      auto ref = load_safetensors(kModels + "/" + name + "/hf_logits.safetensors");
      auto ids = ref.at("unpadded.input_ids");
      TempDir out(std::string("rt_") + name);
      const bool shard = std::string(name) == "llama";
      save_pretrained(m, out.str(), SaveOptions{}.max_shard_bytes(shard ? 100000 : int64_t{1} << 30));
      CHECK(fs::exists(out.path / (shard ? "model.safetensors.index.json" : "model.safetensors")));
      auto back = load_causal_lm(out.str());
      CHECK(max_diff(back->forward(ids), m->forward(ids)) == 0.0);
      CHECK(load_config(out.str()).architecture == m->config().architecture);
      if (std::string(name) == "mistral") {
        CHECK_FALSE(PretrainedReader(out.str()).contains("lm_head.weight"));  // tied: HF omits it
      }
      // re-saving unsharded over a sharded save leaves no stale shard
      save_pretrained(m, out.str(), SaveOptions{}.dtype(at::kBFloat16));
      CHECK(fs::exists(out.path / "model.safetensors"));
      CHECK_FALSE(fs::exists(out.path / "model.safetensors.index.json"));
      CHECK((SafetensorsFile((out.path / "model.safetensors").string()).entry("model.norm.weight").dtype == at::kBFloat16));
      CHECK(load_config(out.str()).dtype == "bfloat16");
    }
    auto policy = load_causal_lm(kModels + "/llama");
    auto critic = make_value_model(policy);
    TempDir out("critic");
    save_pretrained(critic, out.str());
    CHECK(load_config(out.str()).raw["architectures"][0] == "LlamaForTokenClassification");
    auto back = load_value_model(out.str());
    auto ids = torch::randint(0, 320, {2, 6});
    CHECK(max_diff(back->forward(ids), critic->forward(ids)) == 0.0);
    auto fresh = load_value_model(kModels + "/llama");  // policy checkpoint: trunk loaded, score new
    CHECK(max_diff(fresh->model->norm->weight, policy->model->norm->weight) == 0.0);
  }

  TEST_CASE("safetensors: write, map, read back all dtypes") {
    TempDir d("st");
    std::map<std::string, at::Tensor> t = {
        {"f32", torch::randn({3, 4})},
        {"bf16", torch::randn({5}).to(at::kBFloat16)},
        {"f16", torch::randn({2, 2}).to(at::kHalf)},
        {"i64", torch::arange(7)},
        {"empty", torch::zeros({0, 3})},
        {"b", torch::tensor({true, false})}};
    const auto path = (d.path / "x.safetensors").string();
    save_safetensors(path, t, {{"format", "pt"}});
    SafetensorsFile f(path);
    CHECK(f.metadata().at("format") == "pt");
    CHECK(f.names().size() == t.size());
    for (const auto& [k, v] : t) {
      auto r = f.get(k);
      CHECK((r.scalar_type() == v.scalar_type()));
      CHECK((r.sizes() == v.sizes()));
      CHECK(torch::equal(r, v));
    }
    size_t files = 0;
    for (const auto& e : fs::directory_iterator(d.path)) files += e.path().filename() == "x.safetensors" ? 0 : 1;
    CHECK(files == 0);  // no temporary left
  }

  TEST_CASE("safetensors checksums: a damaged byte of any tensor is an Error naming the file and the tensor") {
#if HYBRIDRL_WITH_XXHASH
    TempDir d("st_sum");
    std::map<std::string, at::Tensor> t = {{"a", torch::arange(4, at::kFloat)},
                                           {"b", torch::randn({3, 5}).to(at::kBFloat16)},
                                           {"c", torch::arange(6)},
                                           {"empty", torch::zeros({0, 2})}};
    const auto path = (d.path / "x.safetensors").string();
    save_safetensors(path, t, {{"format", "pt"}}, /*checksums=*/true);
    SafetensorsFile f(path);
    REQUIRE(f.has_checksums());
    CHECK(f.metadata().at("format") == "pt");
    // XXH3-64 of float32 [0, 1, 2, 3], from the reference implementation (python xxhash 3.x,
    // xxh3_64_hexdigest(struct.pack('<4f', 0, 1, 2, 3)))
    const auto sums = nlohmann::json::parse(f.metadata().at(kChecksumKey));
    CHECK(sums.at("a") == "0aee2086d517557e");
    CHECK(sums.at("empty") == "2d06800538d394c2");  // XXH3-64 of no bytes
    for (const auto& [k, v] : t) CHECK(torch::equal(f.get(k), v));
    // one bit of each non-empty tensor's bytes, flipped in turn: that tensor is refused by name,
    // the others still read
    const auto data_start = [&] {
      std::ifstream in(path, std::ios::binary);
      uint64_t n = 0;
      in.read(reinterpret_cast<char*>(&n), 8);
      return 8 + n;
    }();
    for (const char* name : {"a", "b", "c"}) {
      CAPTURE(name);
      const auto& e = f.entry(name);
      for (const size_t at : {e.begin, e.end - 1}) {
        std::string bytes = read_file(path);
        bytes[data_start + at] = static_cast<char>(bytes[data_start + at] ^ 0x01);
        const auto bad = (d.path / "bad.safetensors").string();
        std::ofstream(bad, std::ios::binary) << bytes;
        SafetensorsFile g(bad);
        const auto err = error_of([&] { (void)g.get(name); });
        CHECK(err.find("'" + bad + "', tensor '" + name + "'") != std::string::npos);
        CHECK(err.find("do not match the checksum written with them") != std::string::npos);
        for (const char* other : {"a", "b", "c"}) {
          if (std::string(other) != name) CHECK(torch::equal(g.get(other), t.at(other)));
        }
      }
    }
    // a checksum table that does not cover the tensors, or names another, or is not JSON
    const auto table = [&](const std::string& value) {
      const auto p = (d.path / "t.safetensors").string();
      save_safetensors(p, {{"a", t.at("a")}, {"c", t.at("c")}}, {{kChecksumKey, value}});
      return error_of([&] { SafetensorsFile x(p); });
    };
    CHECK(table(R"({"a": "0aee2086d517557e"})").find("has no checksum of tensor 'c'") != std::string::npos);
    CHECK(table(R"({"a": "0aee2086d517557e", "c": "0000000000000000", "z": "0000000000000000"})")
              .find("which is not a tensor of the file") != std::string::npos);
    CHECK(table(R"({"a": 5, "c": "0000000000000000"})").find("which is not 16 hex digits") != std::string::npos);
    CHECK(table("[1, 2").find("is not a JSON object") != std::string::npos);
    // without checksums (Hugging Face files, save_pretrained): read as they are
    save_safetensors(path, t, {{"format", "pt"}});
    CHECK_FALSE(SafetensorsFile(path).has_checksums());
#else
    MESSAGE("built without xxHash: checkpoints carry no checksums");
#endif
  }

  TEST_CASE("bad checkpoints: errors name the file and the tensor") {
    SUBCASE("truncated file") {
      auto d = copy_fixture("llama", "trunc");
      const auto file = d.path / "model.safetensors";
      auto bytes = read_file(file);
      write_file(file, bytes.substr(0, bytes.size() / 2));
      const auto msg = error_of([&] { load_causal_lm(d.str()); });
      CHECK(msg.find(file.string()) != std::string::npos);
      CHECK(msg.find(", tensor '") != std::string::npos);
      CHECK(msg.find("truncated") != std::string::npos);
      write_file(file, bytes.substr(0, 5));
      CHECK(error_of([&] { load_causal_lm(d.str()); }).find("fewer than the 8-byte") != std::string::npos);
      write_file(file, bytes.substr(0, 100));
      CHECK(error_of([&] { load_causal_lm(d.str()); }).find("header claims") != std::string::npos);
    }
    SUBCASE("corrupt header") {
      auto d = copy_fixture("llama", "corrupt");
      const auto file = d.path / "model.safetensors";
      auto bytes = read_file(file);
      bytes[9] = '#';
      bytes[10] = '!';
      write_file(file, bytes);
      const auto msg = error_of([&] { load_causal_lm(d.str()); });
      CHECK(msg.find(file.string()) != std::string::npos);
      CHECK(msg.find("not valid JSON") != std::string::npos);
    }
    SUBCASE("missing tensor") {
      auto d = copy_fixture("llama", "missing");
      const auto file = (d.path / "model.safetensors").string();
      auto t = load_safetensors(file);
      t.erase("model.layers.1.mlp.up_proj.weight");
      save_safetensors(file, t, {{"format", "pt"}});
      const auto msg = error_of([&] { load_causal_lm(d.str()); });
      CHECK(msg.find(file) != std::string::npos);
      CHECK(msg.find("model.layers.1.mlp.up_proj.weight") != std::string::npos);
    }
    SUBCASE("missing shard of a sharded checkpoint") {
      auto d = copy_fixture("mistral", "shard");
      fs::remove(d.path / "model-00003-of-00008.safetensors");
      const auto msg = error_of([&] { load_causal_lm(d.str()); });
      CHECK(msg.find("model-00003-of-00008.safetensors") != std::string::npos);
    }
    SUBCASE("shape mismatch") {
      auto d = copy_fixture("llama", "shape");
      auto j = nlohmann::json::parse(read_file(d.path / "config.json"));
      j["intermediate_size"] = 96;
      write_file(d.path / "config.json", j.dump());
      const auto msg = error_of([&] { load_causal_lm(d.str()); });
      CHECK(msg.find((d.path / "model.safetensors").string()) != std::string::npos);
      CHECK(msg.find("tensor 'model.layers.0.mlp.gate_proj.weight' has shape [128, 64]") != std::string::npos);
      CHECK(msg.find("implies [96, 64]") != std::string::npos);
    }
    SUBCASE("unknown architecture") {
      auto d = copy_fixture("llama", "arch");
      auto j = nlohmann::json::parse(read_file(d.path / "config.json"));
      j["architectures"] = {"GPT2LMHeadModel"};
      write_file(d.path / "config.json", j.dump());
      const auto msg = error_of([&] { load_causal_lm(d.str()); });
      CHECK(msg.find((d.path / "config.json").string()) != std::string::npos);
      CHECK(msg.find("unknown architecture 'GPT2LMHeadModel'") != std::string::npos);
    }
    SUBCASE("unknown dtype") {
      TempDir d("dtype");
      const auto file = (d.path / "x.safetensors").string();
      std::string header = R"({"w":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})";
      std::string bytes(8, '\0');
      for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
      write_file(file, bytes + header + "ab");
      const auto msg = error_of([&] { SafetensorsFile f(file); });
      CHECK(msg.find(file) != std::string::npos);
      CHECK(msg.find("tensor 'w'") != std::string::npos);
      CHECK(msg.find("unknown dtype 'F8_E4M3'") != std::string::npos);
    }
    SUBCASE("bytes do not match shape, and unexpected tensors in strict mode") {
      TempDir d("bytes");
      const auto file = (d.path / "x.safetensors").string();
      std::string header = R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})";
      std::string bytes(8, '\0');
      for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
      write_file(file, bytes + header + std::string(8, '\0'));
      const auto msg = error_of([&] { SafetensorsFile f(file); });
      CHECK(msg.find("tensor 'w'") != std::string::npos);
      CHECK(msg.find("need 12") != std::string::npos);

      auto c = copy_fixture("llama", "extra");
      const auto mf = (c.path / "model.safetensors").string();
      auto t = load_safetensors(mf);
      t.emplace("model.layers.7.extra.weight", torch::zeros({2}));
      save_safetensors(mf, t, {{"format", "pt"}});
      const auto m2 = error_of([&] { load_causal_lm(c.str()); });
      CHECK(m2.find("model.layers.7.extra.weight") != std::string::npos);
      CHECK(m2.find(mf) != std::string::npos);
      load_causal_lm(c.str(), LoadOptions{}.strict(false));  // tolerated when asked
    }
  }


  TEST_CASE("config validation: every bad field is an Error naming it (zero heads was SIGFPE)") {
    CHECK(static_cast<bool>(config_from_json(small_config()).head_dim == 8));
    auto with = [](const char* key, nlohmann::json v) {
      auto j = small_config();
      j[key] = std::move(v);
      return config_error(j);
    };
    CHECK(with("num_attention_heads", 0).find("x/config.json': num_attention_heads = 0 must be positive") != std::string::npos);
    {  // INT64_MIN / -1 would trap too
      auto j = small_config();
      j["hidden_size"] = INT64_MIN;
      j["num_attention_heads"] = -1;
      CHECK(config_error(j).find("must be positive") != std::string::npos);
    }
    CHECK(with("num_key_value_heads", 3).find("num_attention_heads = 4 is not a multiple of num_key_value_heads = 3") != std::string::npos);
    CHECK(with("head_dim", 7).find("head_dim = 7 is odd") != std::string::npos);
    CHECK(with("vocab_size", -5).find("vocab_size = -5 must be positive") != std::string::npos);
    CHECK(with("vocab_size", 32000.7).find("vocab_size = 32000.7 is not an integer") != std::string::npos);
    CHECK(with("intermediate_size", 0).find("intermediate_size = 0") != std::string::npos);
    CHECK(with("rope_theta", 0.0).find("rope_theta = 0 must be positive") != std::string::npos);
    CHECK(with("rms_norm_eps", -1e-6).find("rms_norm_eps = -1e-06 must be positive") != std::string::npos);
    CHECK(with("max_position_embeddings", 0).find("max_position_embeddings = 0") != std::string::npos);
    CHECK(with("hidden_act", "gelu").find("hidden_act = 'gelu' is not supported") != std::string::npos);
    CHECK(with("rope_scaling", {{"rope_type", "linear"}, {"factor", 0.0}}).find("rope_scaling.factor = 0") != std::string::npos);
    CHECK(with("rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 4.0}, {"high_freq_factor", 1.0}})
              .find("high_freq_factor = 1 must exceed low_freq_factor = 4") != std::string::npos);
    {
      auto j = small_config();
      j["architectures"] = {"MistralForCausalLM"};
      j["sliding_window"] = 0;
      CHECK(config_error(j).find("sliding_window = 0 must be positive") != std::string::npos);
      j["sliding_window"] = nullptr;  // null = full attention
      CHECK_FALSE(config_from_json(j).sliding_window.has_value());
    }
    {
      auto j = small_config();
      j["architectures"] = {"Qwen2ForCausalLM"};
      j["use_sliding_window"] = true;
      CHECK(config_error(j).find("use_sliding_window = true (Qwen2) but sliding_window is null") != std::string::npos);
      j["sliding_window"] = 8;
      j["layer_types"] = {"full_attention", "sliding_attention"};
      CHECK(config_error(j).find("layer_types has 2 entries but num_hidden_layers = 1") != std::string::npos);
      j["num_hidden_layers"] = 2;
      j["layer_types"] = {"full_attention", "chunked_attention"};
      CHECK(config_error(j).find("layer_types[1] = 'chunked_attention' is not supported") != std::string::npos);
      j["layer_types"] = "sliding_attention";
      CHECK(config_error(j).find("layer_types is not a list") != std::string::npos);
    }
    TempDir d("deepcfg");  // deep nesting: an Error, not a stack overflow in the recursive copy
    write_file(d.path / "config.json", "{\"x\": " + std::string(200000, '[') + std::string(200000, ']') + "}");
    CHECK(error_of([&] { load_config(d.str()); }).find("nesting deeper than 64") != std::string::npos);
    CHECK(error_of([&] { load_config(d.str() + "/none"); }).find("cannot read") != std::string::npos);
  }

  TEST_CASE("config_to_json reproduces the transformers-written fixture config.json key by key") {
    for (const std::string name : {"llama", "mistral", "qwen2", "qwen2_swa", "llama_variant"}) {
      CAPTURE(name);
      const auto hf = nlohmann::json::parse(read_file(kModels + "/" + name + "/config.json"));
      // from the parsed fields only (raw emptied), so nothing is merely copied through
      auto c = load_config(kModels + "/" + name);
      c.raw = nlohmann::json::object();
      if (hf.contains("rope_parameters")) c.raw["rope_parameters"] = nlohmann::json::object();
      const auto ours = config_to_json(c);
      for (const auto& [key, want] : ours.items()) {
        CAPTURE(key);
        REQUIRE(hf.contains(key));  // nothing invented
        CHECK(want == hf[key]);
      }
      // every field hybridrl models is written
      for (const char* key : {"architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size",
                              "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                              "max_position_embeddings", "rms_norm_eps", "hidden_act", "tie_word_embeddings",
                              "bos_token_id", "eos_token_id", "dtype"}) {
        CAPTURE(key);
        CHECK(ours.contains(key));
      }
      CHECK(ours.contains("head_dim") == (name.rfind("qwen2", 0) != 0));  // Qwen2Config derives it
      // and with raw kept, the whole file round-trips
      CHECK(config_to_json(load_config(kModels + "/" + name)) == hf);
    }
  }

  TEST_CASE("expected_parameter_shapes equals the model's parameters (policy and critic)") {
    for (const std::string name : {"llama", "mistral", "qwen2", "llama_variant"}) {
      CAPTURE(name);
      const auto c = load_config(kModels + "/" + name);
      CausalLM m(c);
      std::map<std::string, std::vector<int64_t>> got;
      for (const auto& p : m->named_parameters()) got[p.key()] = p.value().sizes().vec();
      auto as_map = [](const std::vector<ParameterShape>& v) {
        std::map<std::string, std::vector<int64_t>> shapes;
        for (const auto& p : v) shapes[p.name] = p.shape;
        CHECK(shapes.size() == v.size());  // no name twice
        return shapes;
      };
      CHECK(got == as_map(expected_parameter_shapes(c)));
      ValueModel v(c);
      got.clear();
      for (const auto& p : v->named_parameters()) got[p.key()] = p.value().sizes().vec();
      CHECK(got == as_map(expected_parameter_shapes(c, true)));
    }
  }

  TEST_CASE("shapes are checked before the model is built: a 2 KB config cannot allocate 10^9 layers") {
    auto d = copy_fixture("llama", "huge");
    auto j = nlohmann::json::parse(read_file(d.path / "config.json"));
    j["num_hidden_layers"] = 1000000000;
    write_file(d.path / "config.json", j.dump());
    auto msg = error_of([&] { load_causal_lm(d.str()); });
    CHECK(msg.find("model.layers.999999999.input_layernorm.weight") != std::string::npos);
    j["num_hidden_layers"] = 2;
    j["vocab_size"] = 1000000000;  // 256 GB of fp32 embedding if built first
    write_file(d.path / "config.json", j.dump());
    msg = error_of([&] { load_causal_lm(d.str()); });
    CHECK(msg.find("tensor 'model.embed_tokens.weight' has shape [320, 64] but config.json implies [1000000000, 64]") !=
          std::string::npos);
  }

  TEST_CASE("ParameterInit: parameters in the scope's dtype, no random draw when asked, scopes nest") {
    const auto c = load_config(kModels + "/llama");
    CHECK((ParameterInit::options().dtype() == caffe2::TypeMeta::Make<float>()));
    CHECK(ParameterInit::random());
    {
      ParameterInit outer(at::TensorOptions().dtype(at::kBFloat16), /*random=*/false);
      CausalLM m(c);
      for (const auto& p : m->named_parameters()) {
        CAPTURE(p.key());
        CHECK((p.value().scalar_type() == at::kBFloat16));
        CHECK(p.value().device().is_cpu());
      }
      {
        ParameterInit inner(at::TensorOptions().dtype(at::kDouble), /*random=*/true);
        CHECK((ParameterInit::options().dtype() == caffe2::TypeMeta::Make<double>()));
        CHECK(ParameterInit::random());
      }
      CHECK((ParameterInit::options().dtype() == caffe2::TypeMeta::Make<c10::BFloat16>()));
      CHECK_FALSE(ParameterInit::random());
    }
    CHECK((ParameterInit::options().dtype() == caffe2::TypeMeta::Make<float>()));
    CHECK(ParameterInit::random());

    // random = false draws nothing: the generator's next numbers are those of a fresh seed. Outside
    // a scope the build draws (the check below would fail if it did not).
    auto next_after = [&](bool build, std::optional<bool> random) {
      at::manual_seed(1234);
      if (build) {
        std::optional<ParameterInit> scope;
        if (random) scope.emplace(at::TensorOptions(), *random);
        CausalLM m(c);
      }
      return at::randn({8});
    };
    const auto fresh = next_after(false, std::nullopt);
    CHECK(at::equal(next_after(true, false), fresh));
    CHECK_FALSE(at::equal(next_after(true, std::nullopt), fresh));
    CHECK_FALSE(at::equal(next_after(true, true), fresh));
  }

  TEST_CASE("loading builds in the target dtype (bit-equal to load-then-convert); a model that does not fit is refused") {
    const auto dir = kModels + "/llama";
    const auto c = load_config(dir);
    auto fp32 = load_causal_lm(dir);
    int64_t numel = 0;
    for (const auto& p : fp32->parameters()) numel += p.numel();
    // parameter_bytes from the config alone equals the built model's count × element size
    CHECK(hybridrl::detail::parameter_bytes(c, ModelHead::language_model, at::kFloat) == 4 * numel);
    CHECK(hybridrl::detail::parameter_bytes(c, ModelHead::language_model, at::kBFloat16) == 2 * numel);

    auto bf16 = load_causal_lm(dir, LoadOptions{}.dtype(at::kBFloat16));
    auto want = fp32->named_parameters();
    for (const auto& p : bf16->named_parameters()) {
      CAPTURE(p.key());
      CHECK((p.value().scalar_type() == at::kBFloat16));
      CHECK(at::equal(p.value(), want[p.key()].to(at::kBFloat16)));
    }

    // the limit: exactly enough loads, one byte less is refused before anything is built
    CHECK_NOTHROW(load_causal_lm(dir, LoadOptions{}.max_memory(4 * numel)));
    auto msg = error_of([&] { load_causal_lm(dir, LoadOptions{}.max_memory(4 * numel - 1)); });
    CHECK(msg.find(fmt::format("take {} bytes", 4 * numel)) != std::string::npos);
    CHECK(msg.find("float32") != std::string::npos);
    CHECK(msg.find("LoadOptions::max_memory") != std::string::npos);
    CHECK(msg.find("model.dtype=bfloat16") != std::string::npos);
    CHECK(msg.find("Sharding<FSDP>") != std::string::npos);
    // the same limit holds the bf16 model, which is half the size
    CHECK_NOTHROW(load_causal_lm(dir, LoadOptions{}.dtype(at::kBFloat16).max_memory(4 * numel - 1)));
    // the critic and the reward model are checked too
    msg = error_of([&] { load_value_model(dir, LoadOptions{}.max_memory(1000)); });
    CHECK(msg.find("available") == std::string::npos);
    CHECK(msg.find("allowed (LoadOptions::max_memory)") != std::string::npos);
    // by default the limit is the memory available now: this machine has room for the tiny model
    const auto avail = available_memory(at::Device(at::kCPU));
    REQUIRE(avail.has_value());
    CHECK(*avail > 4 * numel);
    CHECK_NOTHROW(load_value_model(dir));
  }

  TEST_CASE("save_pretrained removes only HF weight files of an earlier save; the user's stay") {
    torch::NoGradGuard g;
    auto m = load_causal_lm(kModels + "/llama");
    TempDir out("stale");
    save_pretrained(m, out.str(), SaveOptions{}.max_shard_bytes(100000));  // sharded
    size_t shards = 0;
    for (const auto& e : fs::directory_iterator(out.path)) shards += e.path().filename().string().rfind("model-", 0) == 0;
    REQUIRE(shards > 1);
    for (const char* keep : {"model_ema.safetensors", "model.best.safetensors", "model-reward.safetensors",
                             "models.safetensors", "model-1-of-2.safetensors", "notes.txt"}) {
      write_file(out.path / keep, "user data");
    }
    write_file(out.path / "model.safetensors.hybridrl-tmp.123.4.5.6", "crashed save");
    save_pretrained(m, out.str());  // single file now
    std::set<std::string> files;
    for (const auto& e : fs::directory_iterator(out.path)) files.insert(e.path().filename().string());
    CHECK(files == std::set<std::string>{"config.json", "model.safetensors", "model_ema.safetensors",
                                         "model.best.safetensors", "model-reward.safetensors", "models.safetensors",
                                         "model-1-of-2.safetensors", "notes.txt"});
    CHECK(read_file(out.path / "model_ema.safetensors") == "user data");
    auto back = load_causal_lm(out.str());
    CHECK(max_diff(back->model->norm->weight, m->model->norm->weight) == 0.0);
  }

  TEST_CASE("safetensors: the reference reader's layout and header rules") {
    TempDir d("layout");
    const std::string f4 = std::string(16, '\0');
    // valid: two tensors tiling the data
    CHECK(safetensors_error(d, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", f4) == "(no error)");
    CHECK(safetensors_error(d, R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", f4)
              .find("overlap another tensor") != std::string::npos);
    CHECK(safetensors_error(d, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", f4).find("leave a gap") != std::string::npos);
    CHECK(safetensors_error(d, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", f4)
              .find("cover 8 of the 16 data bytes") != std::string::npos);
    CHECK(safetensors_error(d, std::string(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})") + '\0' + "junk", f4)
              .find("NUL byte") != std::string::npos);
    CHECK(safetensors_error(d, std::string(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})") + std::string(6, '\0'), f4)
              .find("NUL byte") != std::string::npos);
    // space padding is the format's own and stays valid
    CHECK(safetensors_error(d, std::string(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})") + "      ", f4) == "(no error)");
    CHECK(safetensors_error(d, R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", f4)
              .find("\"a\" appears twice") != std::string::npos);
    CHECK(safetensors_error(d, R"({"__metadata__":{"format":1},"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", f4)
              .find("__metadata__ value 'format' is number, not a string") != std::string::npos);
    CHECK(safetensors_error(d, R"({"a":{"dtype":"F32","shape":[0,9223372036854775813],"data_offsets":[0,0]}})", "")
              .find("impossibly large") != std::string::npos);
    const auto deep = "{\"a\":{\"dtype\":\"F32\",\"shape\":" + std::string(200000, '[') + std::string(200000, ']') +
                      ",\"data_offsets\":[0,0]}}";
    CHECK(safetensors_error(d, deep, "").find("nesting deeper than") != std::string::npos);
    {  // a length field beyond 100 MB is rejected before anything is parsed
      const auto p = d.path / "big.safetensors";
      std::string bytes(8, '\0');
      const uint64_t n = 200'000'000;
      for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
      write_file(p, bytes + "{}");
      CHECK(error_of([&] { SafetensorsFile f(p.string()); }).find("more than the format's limit") != std::string::npos);
    }
    {  // a FIFO: rejected at once, no blocking open
      const auto p = (d.path / "fifo.safetensors").string();
      REQUIRE(::mkfifo(p.c_str(), 0600) == 0);
      CHECK(error_of([&] { SafetensorsFile f(p); }).find("is not a regular file") != std::string::npos);
    }
    CHECK(error_of([&] { SafetensorsFile f(d.str()); }).find("is not a regular file") != std::string::npos);
    {  // a Git LFS pointer instead of the weights: named as such
      const auto p = d.path / "lfs.safetensors";
      write_file(p, "version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 12\n");
      const auto msg = error_of([&] { SafetensorsFile f(p.string()); });
      CHECK(msg.find("starts with bytes 76 65 72 73 69 6f 6e 20") != std::string::npos);
      CHECK(msg.find("Git LFS pointer") != std::string::npos);
    }
  }

  TEST_CASE("safetensors: an in-place op on a zero-copy tensor changes only this process's copy") {
    TempDir d("cow");
    const auto p = (d.path / "w.safetensors").string();
    save_safetensors(p, {{"w", torch::arange(1024, torch::kFloat)}});
    const auto before = read_file(p);
    SafetensorsFile f(p);
    auto t = f.get("w");
    t.add_(1.0f);  // PROT_READ mapping: SIGSEGV before
    CHECK(t[0].item<float>() == 1.0f);
    CHECK(read_file(p) == before);
    CHECK(SafetensorsFile(p).get("w")[0].item<float>() == 0.0f);
  }

  TEST_CASE("index weight_map: absolute names and '..' are rejected before any file is opened") {
    for (const std::string bad : {"/etc/passwd", "../llama/model.safetensors", "sub/../../x", ""}) {
      CAPTURE(bad);
      auto d = copy_fixture("mistral", "idx");
      auto j = nlohmann::json::parse(read_file(d.path / "model.safetensors.index.json"));
      j["weight_map"]["model.norm.weight"] = bad;
      write_file(d.path / "model.safetensors.index.json", j.dump());
      const auto msg = error_of([&] { PretrainedReader r(d.str()); });
      CHECK(msg.find("which is not inside the checkpoint directory") != std::string::npos);
      CHECK(msg.find("root:") == std::string::npos);
    }
  }

  TEST_CASE("saved checkpoints are byte for byte the files transformers loaded (fixtures/models/roundtrip.json)") {
    // make_model_fixtures.py --roundtrip-fixture loaded these checkpoints with transformers (logits
    // equal to the fixture's to 1e-5, the critic's values recorded) and hashed every file: the same
    // save must give the same bytes here. With HYBRIDRL_ROUNDTRIP_DIR set they stay there for it.
    const char* keep = std::getenv("HYBRIDRL_ROUNDTRIP_DIR");
    TempDir scratch("roundtrip");
    const std::string out = keep != nullptr ? std::string(keep) : scratch.str();
    torch::NoGradGuard g;
    for (const char* name : {"llama", "mistral", "qwen2", "llama_variant"}) {
      auto m = load_causal_lm(kModels + "/" + name);
      const bool bf16 = std::string(name) == "qwen2";  // stored bf16: saving bf16 again is exact
      save_pretrained(m, out + "/" + name,
                      SaveOptions{}.max_shard_bytes(std::string(name) == "llama" ? 100000 : int64_t{1} << 30)
                          .dtype(bf16 ? std::optional<at::ScalarType>(at::kBFloat16) : std::nullopt));
    }
    auto critic = make_value_model(load_causal_lm(kModels + "/llama"));
    const auto H = critic->config().hidden_size;
    // fixed and exact in fp32 (integers / 64), not an RNG draw or linspace (whose rounding moved in 2.x)
    critic->score->weight.copy_(((at::arange(H, at::kFloat) - static_cast<double>(H / 2)) / 64.0).view({1, H}));
    critic->score->bias.fill_(0.125);
    save_pretrained(critic, out + "/llama.critic");
    REQUIRE_MESSAGE(fs::exists(kModels + "/roundtrip.json"),
                    "run tests/fixtures/make_model_fixtures.py --roundtrip-fixture on the checkpoints written here");
    const auto want = nlohmann::json::parse(read_file(kModels + "/roundtrip.json"));
    REQUIRE(want["checkpoints"].size() == 5);
    for (const auto& [name, entry] : want["checkpoints"].items()) {
      CAPTURE(name);
      std::set<std::string> have;
      for (const auto& e : fs::directory_iterator(out + "/" + name)) have.insert(e.path().filename().string());
      std::set<std::string> files;
      for (const auto& [f, hash] : entry["files"].items()) {
        files.insert(f);
        CAPTURE(f);
        CHECK(fnv1a64(out + "/" + name + "/" + f) == hash.get<std::string>());
      }
      CHECK(have == files);
      if (entry.contains("max_abs_diff")) CHECK(entry["max_abs_diff"].get<double>() <= 1e-5);
    }
    // the critic: transformers' AutoModelForTokenClassification values of the saved files = ours
    const auto ids = load_safetensors(kModels + "/llama/hf_logits.safetensors").at("unpadded.input_ids");
    const auto& v = want["checkpoints"]["llama.critic"]["values"];
    std::vector<float> flat;
    for (const auto& row : v) for (const auto& x : row) flat.push_back(x.get<float>());
    const auto hf_values = torch::tensor(flat).view({ids.size(0), ids.size(1)});
    CHECK(max_diff(critic->forward(ids), hf_values) <= 1e-5);
    MESSAGE("round trip: transformers " << want["transformers"].get<std::string>() << " loaded the files of "
                                        << want["checkpoints"].size() << " checkpoints");
  }

  // a tool for scripts/gpu_acceptance.sh (run there with --no-skip), not a test: skipped in ctest
  TEST_CASE("dump logits of a checkpoint (HYBRIDRL_DUMP_LOGITS_DIR, bf16 on CUDA when present)" * doctest::skip()) {
    const char* dir = std::getenv("HYBRIDRL_DUMP_LOGITS_DIR");
    if (dir == nullptr) return;
    torch::NoGradGuard g;
    const bool cuda = torch::cuda::is_available();
    auto m = load_causal_lm(dir, LoadOptions{}
                                     .device(cuda ? at::Device(at::kCUDA) : at::Device(at::kCPU))
                                     .dtype(cuda ? at::kBFloat16 : at::kFloat));
    m->eval();
    auto ids = load_safetensors(std::string(dir) + "/inputs.safetensors").at("input_ids");
    auto logits = m->forward(ids.to(m->parameters().front().device())).to(at::kFloat).cpu();
    save_safetensors(std::string(dir) + "/hybridrl_logits.safetensors", {{"logits", logits}});
    MESSAGE("wrote " << dir << "/hybridrl_logits.safetensors (" << (cuda ? "CUDA bf16" : "CPU fp32") << ")");
  }

  TEST_CASE("reward model: load_reward_model scores as transformers' LlamaForSequenceClassification, any padding") {
    const auto dir = kModels + "/llama_rm";
    auto rm = load_reward_model(dir);
    CHECK_FALSE(rm->is_training());
    for (const auto& p : rm->parameters()) CHECK_FALSE(p.requires_grad());
    const auto ref = load_safetensors(dir + "/hf_scores.safetensors");
    torch::NoGradGuard g;
    for (const char* pad : {"unpadded", "left", "right"}) {
      CAPTURE(pad);
      const std::string k = pad;
      const auto got = rm->score_sequences(ref.at(k + ".input_ids"), ref.at(k + ".attention_mask"));
      const auto want = ref.at(k + ".scores");
      MESSAGE(pad << ": max |ours - transformers| = " << (got - want).abs().max().item<double>());
      CHECK(at::allclose(got, want, 1e-5, 1e-5));
    }
    // a policy checkpoint is no reward model; a reward model is no policy
    CHECK(contains(error_of([&] { (void)load_reward_model(kModels + "/llama"); }),
                   "holds a LlamaForCausalLM checkpoint, not a reward model"));
    CHECK(contains(error_of([&] { (void)load_causal_lm(dir); }), "has no tensor 'lm_head.weight'"));
    CHECK(contains(error_of([&] { (void)rm->score_sequences(at::ones({2, 3}, at::kLong), at::zeros({2, 3}, at::kLong)); }),
                   "a row has no token"));
  }
}
