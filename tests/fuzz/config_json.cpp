// libFuzzer target: a Hugging Face config.json (model/config.hpp). The input is the file, then
// optionally a NUL and a generation_config.json. config.json alone goes through io::parse_json and
// config_from_json, as load_config reads it; with a generation_config.json both are written to a
// scratch directory and read by load_config. A config that loads must also load again after
// config_to_json (what save_pretrained writes), to the same numbers.
#include <hybridrl/io/json.hpp>
#include <hybridrl/model/config.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz_support.hpp"

namespace {

/// config_to_json(c) must read back as c (a config hybridrl saves, it can load).
void check_round_trip(const hybridrl::ModelConfig& c) {
  hybridrl::ModelConfig again;
  try {
    again = hybridrl::config_from_json(hybridrl::config_to_json(c), "config_to_json");
  } catch (const hybridrl::Error& e) {
    std::fprintf(stderr, "config_to_json wrote a config that does not load: %s\n", e.what());
    std::abort();
  }
  const bool same = again.architecture == c.architecture && again.vocab_size == c.vocab_size &&
                    again.hidden_size == c.hidden_size && again.intermediate_size == c.intermediate_size &&
                    again.num_hidden_layers == c.num_hidden_layers &&
                    again.num_attention_heads == c.num_attention_heads &&
                    again.num_key_value_heads == c.num_key_value_heads && again.head_dim == c.head_dim &&
                    again.sliding_window == c.sliding_window && again.layer_types == c.layer_types &&
                    again.rope_scaling.type == c.rope_scaling.type;
  if (!same) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = hybridrl::fuzz::split_at_nul(hybridrl::fuzz::bytes_of(data, size), 1);
  try {
    if (parts[1].empty()) {
      auto parsed = hybridrl::io::parse_json(parts[0]);
      if (!parsed) return 0;
      const auto c = hybridrl::config_from_json(parsed.value, "config.json");
      check_round_trip(c);
    } else {
      const auto& dir = hybridrl::fuzz::scratch_dir();
      hybridrl::fuzz::write_file(dir / "config.json", parts[0]);
      hybridrl::fuzz::write_file(dir / "generation_config.json", parts[1]);
      const auto c = hybridrl::load_config(dir.string());
      check_round_trip(c);
    }
  } catch (const hybridrl::Error&) {
  }
  return 0;
}
