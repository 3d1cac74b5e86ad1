#pragma once
/// \file
/// Models: the Llama-family causal LM and critic (Llama, Mistral, Qwen2), Hugging Face checkpoint
/// I/O (config.json + safetensors), activation checkpointing, tensor-parallel layers, chunked
/// log-probs, and the tokenizer concept with ByteTokenizer. The sentencepiece tokenizer is optional
/// and not included here: include <hybridrl/tokenizer/sentencepiece.hpp> yourself. See
/// docs/models.md.

#include "hybridrl/model/activation_checkpoint.hpp"
#include "hybridrl/model/attention.hpp"
#include "hybridrl/model/config.hpp"
#include "hybridrl/model/parameter_init.hpp"
#include "hybridrl/model/parallel.hpp"
#include "hybridrl/model/layers.hpp"
#include "hybridrl/model/decoder.hpp"
#include "hybridrl/model/causal_lm.hpp"
#include "hybridrl/model/fingerprint.hpp"
#include "hybridrl/model/log_probs.hpp"
#include "hybridrl/model/safetensors.hpp"
#include "hybridrl/model/pretrained.hpp"
#include "hybridrl/tokenizer/tokenizer.hpp"
