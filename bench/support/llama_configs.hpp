#pragma once
// The random-init Llama configs of the GPU benchmarks, as ../shared/bench/hf_baseline.py and the
// Python peers define them: "160m" (12 layers × 768, 12 heads) and "1b" (22 layers × 2048, 32
// heads, 4 KV heads), vocabulary 32000; "small" (4 layers × 256, a CPU run in seconds) and "tiny"
// (2 layers × 64, a smoke test of a bench program itself).
#include <hybridrl/model/config.hpp>

#include <string>

namespace hybridrl::bench {

inline ModelConfig llama(const std::string& name) {
  ModelConfig c;
  if (name == "tiny") {
    c.vocab_size = 512; c.hidden_size = 64; c.intermediate_size = 128; c.num_hidden_layers = 2;
    c.num_attention_heads = 4; c.num_key_value_heads = 2;
  } else if (name == "small") {
    c.vocab_size = 2048; c.hidden_size = 256; c.intermediate_size = 688; c.num_hidden_layers = 4;
    c.num_attention_heads = 8; c.num_key_value_heads = 4;
  } else if (name == "160m") {
    c.vocab_size = 32000; c.hidden_size = 768; c.intermediate_size = 2048; c.num_hidden_layers = 12;
    c.num_attention_heads = 12; c.num_key_value_heads = 12;
  } else {
    c.vocab_size = 32000; c.hidden_size = 2048; c.intermediate_size = 5632; c.num_hidden_layers = 22;
    c.num_attention_heads = 32; c.num_key_value_heads = 4;
  }
  c.head_dim = c.hidden_size / c.num_attention_heads;
  c.max_position_embeddings = 2048;
  c.rms_norm_eps = 1e-5;
  c.eos_token_id = 2;
  c.pad_token_id = 0;
  return c;
}

}  // namespace hybridrl::bench
