#pragma once
/// \file
/// Forwarding header: SentencePieceTokenizer now lives in hybridrl/tokenizer/sentencepiece.hpp.
#include "hybridrl/tokenizer/sentencepiece.hpp"
