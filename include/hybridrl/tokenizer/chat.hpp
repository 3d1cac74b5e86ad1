#pragma once
/// \file
/// Chat formats: a conversation (`messages`, each {"role", "content"}) rendered as the text a chat
/// checkpoint was trained on, ending with the generation prompt (transformers'
/// `apply_chat_template(messages, add_generation_prompt=True)`), then encoded without further
/// special tokens. Built in: ChatML (Qwen2/2.5: `<|im_start|>role\n…<|im_end|>\n`, with the
/// template's default system message when the conversation has none) and Llama-3
/// (`<|begin_of_text|><|start_header_id|>role<|end_header_id|>\n\n…<|eot_id|>`, contents trimmed).
/// `ChatFormat::from_template` recognises them in tokenizer_config.json's Jinja `chat_template`
/// (hybridrl runs no Jinja); any other format is a ChatFormat a user fills in.

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <optional>
#include <regex>
#include <string>
#include <string_view>

#include "hybridrl/core/error.hpp"

namespace hybridrl {

/// How a conversation becomes text: `bos`, then per message `prefix` (with `{role}` replaced) +
/// content (trimmed when `trim`) + `suffix`, then `generation_prompt`. `default_system`, when not
/// empty, is the system message added before a conversation that does not start with one.
struct ChatFormat {
  std::string name = "custom";
  std::string bos;
  std::string prefix;
  std::string suffix;
  std::string generation_prompt;
  std::string default_system;
  bool trim = false;

  /// ChatML, as Qwen2 and Qwen2.5 use it; `default_system` as their template sets it.
  static ChatFormat chatml(std::string default_system = "") {
    ChatFormat f;
    f.name = "chatml";
    f.prefix = "<|im_start|>{role}\n";
    f.suffix = "<|im_end|>\n";
    f.generation_prompt = "<|im_start|>assistant\n";
    f.default_system = std::move(default_system);
    return f;
  }

  /// Llama-3 (and 3-Instruct): the BOS text first, headers around the role, contents trimmed.
  static ChatFormat llama3() {
    ChatFormat f;
    f.name = "llama3";
    f.bos = "<|begin_of_text|>";
    f.prefix = "<|start_header_id|>{role}<|end_header_id|>\n\n";
    f.suffix = "<|eot_id|>";
    f.generation_prompt = "<|start_header_id|>assistant<|end_header_id|>\n\n";
    f.trim = true;
    return f;
  }

  /// The built-in format of a tokenizer_config.json `chat_template` (Jinja source), or nullopt
  /// when it is neither ChatML nor Llama-3. ChatML's default system message is read from the
  /// template's literal `<|im_start|>system\n…<|im_end|>` (Qwen2: "You are a helpful assistant.").
  static std::optional<ChatFormat> from_template(std::string_view jinja) {
    const std::string t(jinja);
    if (t.find("<|im_start|>") != std::string::npos) {
      // a literal system turn inside a string: '<|im_start|>system\nTEXT<|im_end|>' (the line end
      // a newline, or the two characters \n where the file escapes it twice)
      static const std::regex sys(R"(<\|im_start\|>system(?:\\n|\n)([^'"{}<]*)<\|im_end\|>)");
      std::smatch m;
      std::string def;
      if (std::regex_search(t, m, sys)) def = m[1].str();
      return chatml(def);
    }
    if (t.find("<|start_header_id|>") != std::string::npos && t.find("<|eot_id|>") != std::string::npos) {
      if (t.find("Cutting Knowledge Date") != std::string::npos) return std::nullopt;  // 3.1's dated system header
      return llama3();
    }
    return std::nullopt;
  }

  /// A built-in format by name: chatml or llama3.
  static ChatFormat named(std::string_view n) {
    if (n == "chatml") return chatml();
    if (n == "llama3") return llama3();
    throw Error(fmt::format("chat format \"{}\" is not built in", n),
                "use chatml (Qwen2) or llama3, or auto (the checkpoint's tokenizer_config.json chat_template), or "
                "fill in a ChatFormat yourself");
  }

  /// The text of `messages` (a list of {"role", "content"} with string values), ending with the
  /// generation prompt when `add_generation_prompt`. Errors name the message and the field.
  [[nodiscard]] std::string render(const nlohmann::json& messages, bool add_generation_prompt = true) const {
    HYBRIDRL_CHECK(messages.is_array() && !messages.empty(), "\"messages\" is not a non-empty list",
                   "give \"messages\": [{\"role\": \"user\", \"content\": \"...\"}, ...]");
    std::string out = bos;
    auto turn = [&](const std::string& role, const std::string& content) {
      std::string p = prefix;
      const auto at = p.find("{role}");
      if (at != std::string::npos) p.replace(at, 6, role);
      out += p;
      out += trim ? trimmed(content) : content;
      out += suffix;
    };
    for (size_t i = 0; i < messages.size(); ++i) {
      const auto& m = messages[i];
      HYBRIDRL_CHECK(m.is_object() && m.contains("role") && m["role"].is_string() && m.contains("content") &&
                         m["content"].is_string(),
                     fmt::format("messages[{}] is not {{\"role\": string, \"content\": string}}", i),
                     "give each message a role (system, user, assistant) and a text content");
      if (i == 0 && !default_system.empty() && m["role"].get<std::string>() != "system") turn("system", default_system);
      turn(m["role"].get<std::string>(), m["content"].get<std::string>());
    }
    if (add_generation_prompt) out += generation_prompt;
    return out;
  }

 private:
  static std::string trimmed(const std::string& s) {  // Jinja's |trim: Python's str.strip()
    const auto ws = " \t\n\r\f\v";
    const auto b = s.find_first_not_of(ws);
    if (b == std::string::npos) return {};
    return s.substr(b, s.find_last_not_of(ws) - b + 1);
  }
};

}  // namespace hybridrl
