#pragma once
/// \file
/// YAML for reflectable Options (optional: needs yaml-cpp; the CMake package defines
/// HYBRIDRL_WITH_YAML=1 and links it when found). A YAML document is read as a tree of text
/// scalars and handed to the same reader as overrides (core/config.hpp), so every scalar is
/// parsed by its field's type and the errors are the same: unknown keys with the nearest valid
/// one, wrong types with the expected type, enum values with the valid names.

#if !__has_include(<yaml-cpp/yaml.h>)
#error "hybridrl/core/options_yaml.hpp needs yaml-cpp (Debian/Ubuntu: apt-get install libyaml-cpp-dev)"
#endif

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

#include "hybridrl/core/config.hpp"
#include "hybridrl/core/error.hpp"

namespace hybridrl {

namespace detail {

/// A YAML node as JSON whose scalars are strings (null for YAML null); the field type parses them.
inline nlohmann::json yaml_to_text_json(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Scalar:
      return n.Scalar();
    case YAML::NodeType::Sequence: {
      nlohmann::json a = nlohmann::json::array();
      for (const auto& x : n) a.push_back(yaml_to_text_json(x));
      return a;
    }
    case YAML::NodeType::Map: {
      nlohmann::json o = nlohmann::json::object();
      for (const auto& kv : n) o[kv.first.as<std::string>()] = yaml_to_text_json(kv.second);
      return o;
    }
  }
  return nullptr;
}

inline void emit_json(YAML::Emitter& out, const nlohmann::json& j) {
  if (j.is_object()) {
    out << YAML::BeginMap;
    for (auto it = j.begin(); it != j.end(); ++it) {
      out << YAML::Key << it.key() << YAML::Value;
      emit_json(out, it.value());
    }
    out << YAML::EndMap;
  } else if (j.is_array()) {
    out << YAML::Flow << YAML::BeginSeq;
    for (const auto& x : j) emit_json(out, x);
    out << YAML::EndSeq;
  } else if (j.is_null()) {
    out << YAML::Null;
  } else if (j.is_string()) {
    const auto s = j.get<std::string>();
    if (s.empty()) out << YAML::DoubleQuoted;
    out << s;
  } else {
    out << j.dump();  // numbers and bools in JSON spelling: exact round trip for doubles
  }
}

}  // namespace detail

/// `o` as a YAML document (block tables, flow lists; keys sorted, as nlohmann::json keeps them).
template <reflectable_options O>
[[nodiscard]] std::string to_yaml(const O& o) {
  YAML::Emitter out;
  detail::emit_json(out, detail::write_options(o));
  return std::string(out.c_str()) + "\n";
}

/// Sets the fields a YAML document names (others keep their values); errors as from_json.
template <reflectable_options O>
void from_yaml(std::string_view text, O& o, std::string_view source = "YAML") {
  nlohmann::json tree;
  try {
    const YAML::Node root = YAML::Load(std::string(text));
    if (root.IsNull()) return;  // an empty document changes nothing
    tree = detail::yaml_to_text_json(root);  // throws for a key that is not a scalar
  } catch (const YAML::Exception& e) {
    throw Error(fmt::format("{} is not valid YAML: {}", source, e.what()),
                "fix the YAML syntax at the line and column shown");
  }
  detail::read_options(tree, o, "", detail::ValueForm::text, source, detail::all_keys(o));
}

/// Default options with the fields a YAML document names set: `from_yaml<PagedOptions>(text)`.
template <reflectable_options O>
[[nodiscard]] O from_yaml(std::string_view text) {
  O o{};
  from_yaml(text, o);
  return o;
}

/// A YAML configuration file as the text-form JSON tree `configure` takes (ConfigSources::file).
[[nodiscard]] inline nlohmann::json read_yaml_file(const std::string& path) {
  std::ifstream in(path);
  HYBRIDRL_CHECK(in.good(), fmt::format("cannot open configuration file {}", path),
                 "check the path and its permissions");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return detail::yaml_to_text_json(YAML::Load(ss.str()));
  } catch (const YAML::Exception& e) {
    throw Error(fmt::format("{} is not valid YAML: {}", path, e.what()),
                "fix the YAML syntax at the line and column shown");
  }
}

}  // namespace hybridrl
