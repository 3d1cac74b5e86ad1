#pragma once
/// \file
/// Forwarding header: the `tokenizer` concept and ByteTokenizer now live in
/// hybridrl/tokenizer/tokenizer.hpp (data/ and model/ both use them).
#include "hybridrl/tokenizer/tokenizer.hpp"
