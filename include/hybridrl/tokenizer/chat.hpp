#pragma once
/// \file
/// Chat formats: a conversation (`messages`, each {"role", "content"}) rendered as the text a chat
/// checkpoint was trained on, ending with the generation prompt (transformers'
/// `apply_chat_template(messages, add_generation_prompt=True)`), then encoded without further
/// special tokens. Built in: ChatML (Qwen2/2.5: `<|im_start|>role\n…<|im_end|>\n`, with the
/// template's default system message when the conversation has none), Llama-3
/// (`<|begin_of_text|><|start_header_id|>role<|end_header_id|>\n\n…<|eot_id|>`, contents trimmed)
/// and Llama-3.1 (3.2, 3.3: the same, with a system turn always first that opens with the dated
/// header "Cutting Knowledge Date: December 2023\nToday Date: …\n\n").
/// `ChatFormat::from_template` recognises them in tokenizer_config.json's Jinja `chat_template`
/// (hybridrl runs no Jinja); any other format is a ChatFormat a user fills in.

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <ctime>
#include <optional>
#include <string>
#include <string_view>

#include "hybridrl/core/error.hpp"

namespace hybridrl {

/// How a conversation becomes text: `bos`, then per message `prefix` (with `{role}` replaced) +
/// content (trimmed when `trim`) + `suffix`, then `generation_prompt`. `default_system`, when not
/// empty, is the system message added before a conversation that does not start with one.
/// `system_preamble`, when not empty, makes the first turn always a system turn whose content is
/// the preamble (`{date}` replaced by `date`, or by today's local date as "%d %b %Y" — transformers'
/// `strftime_now` — when `date` is empty) followed by the conversation's system message, if it
/// starts with one (trimmed when `trim`); `default_system` is then not used.
struct ChatFormat {
  std::string name = "custom";
  std::string bos;
  std::string prefix;
  std::string suffix;
  std::string generation_prompt;
  std::string default_system;
  std::string system_preamble;
  std::string date;
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

  /// Llama-3.1, 3.2 and 3.3 (-Instruct): Llama-3 with the dated system header. `date` is the
  /// "Today Date" (3.1's template fixes "26 Jul 2024"; 3.2 and 3.3 take today's: pass ""), and
  /// `knowledge` the "Cutting Knowledge Date".
  static ChatFormat llama31(std::string date = "26 Jul 2024", std::string_view knowledge = "December 2023") {
    ChatFormat f = llama3();
    f.name = "llama3.1";
    f.system_preamble = fmt::format("Cutting Knowledge Date: {}\nToday Date: {{date}}\n\n", knowledge);
    f.date = std::move(date);
    return f;
  }

  /// The built-in format of a tokenizer_config.json `chat_template` (Jinja source), or nullopt
  /// when it is none of ChatML, Llama-3 and Llama-3.1. ChatML's default system message is read
  /// from the template's literal `<|im_start|>system\n…<|im_end|>` (Qwen2: "You are a helpful
  /// assistant."); Llama-3.1's dates from its `Cutting Knowledge Date: …` and
  /// `set date_string = "…"` (a template that calls `strftime_now` dates with today).
  static std::optional<ChatFormat> from_template(std::string_view jinja) {
    // Plain searches, linear in the template (std::regex recursed once per character and
    // overflowed the stack on a template of a megabyte).
    const std::string_view t = jinja;
    if (t.find("<|im_start|>") != std::string_view::npos) {
      // a literal system turn inside a string: '<|im_start|>system\nTEXT<|im_end|>' (the line end
      // a newline, or the two characters \n where the file escapes it twice)
      std::string def;
      constexpr std::string_view open = "<|im_start|>system", close = "<|im_end|>";
      for (size_t at = t.find(open); at != std::string_view::npos; at = t.find(open, at + 1)) {
        size_t b = at + open.size();
        if (t.substr(b, 2) == "\\n") b += 2;
        else if (t.substr(b, 1) == "\n") b += 1;
        else continue;
        const size_t e = std::min(t.find_first_of("'\"{}<", b), t.size());
        if (t.substr(e, close.size()) == close) {
          def = std::string(t.substr(b, e - b));
          break;
        }
      }
      return chatml(def);
    }
    if (t.find("<|start_header_id|>") != std::string_view::npos && t.find("<|eot_id|>") != std::string_view::npos) {
      if (t.find("Cutting Knowledge Date") == std::string_view::npos) return llama3();
      // 3.1's dated system header: the literals inside the template's Jinja strings
      constexpr std::string_view knowledge = "Cutting Knowledge Date: ";
      std::string kd = "December 2023";
      if (const size_t k = t.find(knowledge); k != std::string_view::npos) {
        const size_t kb = k + knowledge.size();
        kd = std::string(t.substr(kb, std::min(t.find_first_of("\"'\\{}<", kb), t.size()) - kb));
      }
      if (t.find("strftime_now") != std::string_view::npos) return llama31("", kd);
      constexpr std::string_view fixed = "set date_string = ";
      for (size_t at = t.find(fixed); at != std::string_view::npos; at = t.find(fixed, at + 1)) {
        const size_t q = at + fixed.size();
        if (q >= t.size() || (t[q] != '"' && t[q] != '\'')) continue;
        const size_t e = t.find_first_of("\"'", q + 1);
        if (e != std::string_view::npos) return llama31(std::string(t.substr(q + 1, e - q - 1)), kd);
      }
      return llama31("26 Jul 2024", kd);
    }
    return std::nullopt;
  }

  /// A built-in format by name: chatml, llama3 or llama3.1 (its fixed "26 Jul 2024").
  static ChatFormat named(std::string_view n) {
    if (n == "chatml") return chatml();
    if (n == "llama3") return llama3();
    if (n == "llama3.1") return llama31();
    throw Error(fmt::format("chat format \"{}\" is not built in", n),
                "use chatml (Qwen2), llama3 or llama3.1, or auto (the checkpoint's tokenizer_config.json chat_template), or "
                "fill in a ChatFormat yourself");
  }

  /// The name, and for a dated format the date: "chatml", "llama3.1 (dated today)".
  [[nodiscard]] std::string describe() const {
    return system_preamble.empty() ? name : fmt::format("{} (dated {})", name, date.empty() ? "today" : date);
  }

  /// The text of `messages` (a list of {"role", "content"} with string values), ending with the
  /// generation prompt when `add_generation_prompt`. Errors name the message and the field.
  [[nodiscard]] std::string render(const nlohmann::json& messages, bool add_generation_prompt = true) const {
    HYBRIDRL_CHECK(messages.is_array() && !messages.empty(), "\"messages\" is not a non-empty list",
                   "give \"messages\": [{\"role\": \"user\", \"content\": \"...\"}, ...]");
    std::string out = bos;
    auto turn = [&](const std::string& role, const std::string& content, bool trim_content) {
      std::string p = prefix;
      const auto at = p.find("{role}");
      if (at != std::string::npos) p.replace(at, 6, role);
      out += p;
      out += trim_content ? trimmed(content) : content;
      out += suffix;
    };
    for (size_t i = 0; i < messages.size(); ++i) {
      const auto& m = messages[i];
      HYBRIDRL_CHECK(m.is_object() && m.contains("role") && m["role"].is_string() && m.contains("content") &&
                         m["content"].is_string(),
                     fmt::format("messages[{}] is not {{\"role\": string, \"content\": string}}", i),
                     "give each message a role (system, user, assistant) and a text content");
    }
    const auto role = [&](size_t i) { return messages[i]["role"].get<std::string>(); };
    const auto content = [&](size_t i) { return messages[i]["content"].get<std::string>(); };
    size_t first = 0;
    if (!system_preamble.empty()) {  // the system turn is always there, the preamble first
      std::string sys = system_preamble;
      const auto at = sys.find("{date}");
      if (at != std::string::npos) sys.replace(at, 6, date.empty() ? today() : date);
      if (role(0) == "system") {
        sys += trim ? trimmed(content(0)) : content(0);
        first = 1;
      }
      turn("system", sys, false);  // the preamble's own line ends stay
    } else if (!default_system.empty() && role(0) != "system") {
      turn("system", default_system, trim);
    }
    for (size_t i = first; i < messages.size(); ++i) turn(role(i), content(i), trim);
    if (add_generation_prompt) out += generation_prompt;
    return out;
  }

 private:
  static std::string today() {  // transformers' strftime_now("%d %b %Y"): local time, C locale names
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[32];
    const auto n = std::strftime(buf, sizeof buf, "%d %b %Y", &tm);
    return std::string(buf, n);
  }
  static std::string trimmed(const std::string& s) {  // Jinja's |trim: Python's str.strip()
    const auto ws = " \t\n\r\f\v";
    const auto b = s.find_first_not_of(ws);
    if (b == std::string::npos) return {};
    return s.substr(b, s.find_last_not_of(ws) - b + 1);
  }
};

}  // namespace hybridrl
