#pragma once
/// \file
/// Options structs: runtime numbers with chainable setters, as in the PyTorch C++ frontend, plus
/// one field visitor per struct (the substrate of YAML/JSON, dotted overrides, --help, the printed
/// effective configuration and checkpoint metadata).
///
/// `HYBRIDRL_ARG(T, name) = default;` declares a field `name_` with a getter `name()` and a
/// chainable setter `name(value)`, so users write `PPOOptions{}.clip_low(0.2).clip_high(0.28)`.
/// Unlike TORCH_ARG it leaves the struct's access public, so `validate()` may follow the fields.
///
/// `HYBRIDRL_FIELDS(a, b, c)` inside the struct lists its fields once and generates
/// `template <class Self, class F> static void visit_fields(Self& self, F&& f)`, which calls
/// `f("a", self.a_)` for each (Self may be const). Nested Options fields are visited as values
/// whose own type has `visit_fields`.
///
/// Every Options struct has `void validate() const` that throws hybridrl::Error whose problem
/// starts with the field's name ("clip_low = 1.5 must lie in (0, 1)"); a parent validates a nested
/// struct with `detail::validate_member(child_, "child")`, which prefixes "child." — so a message
/// always carries the full dotted path of the field, as the configuration spells it.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "hybridrl/core/error.hpp"

/// Declares an option field with getter and chainable setter (the TORCH_ARG idiom).
#define HYBRIDRL_ARG(T, name)                                    \
  auto name(const T& new_##name)->decltype(*this) {              \
    this->name##_ = new_##name;                                  \
    return *this;                                                \
  }                                                              \
  auto name(T&& new_##name)->decltype(*this) {                   \
    this->name##_ = std::move(new_##name);                       \
    return *this;                                                \
  }                                                              \
  const T& name() const noexcept { return this->name##_; }       \
  T& name() noexcept { return this->name##_; }                   \
  T name##_

/// Forwards `name()` and the chainable setter `name(value)` to the field of the same name of the
/// nested Options member `member_`, so a struct composed of shared options keeps a flat API.
#define HYBRIDRL_FORWARD_ARG(T, member, name)                    \
  auto name(const T& new_##name)->decltype(*this) {              \
    this->member##_.name(new_##name);                            \
    return *this;                                                \
  }                                                              \
  const T& name() const noexcept { return this->member##_.name(); } \
  T& name() noexcept { return this->member##_.name(); }

// ---- preprocessor for-each (C++20 __VA_OPT__; up to 256 arguments) ----
#define HYBRIDRL_PP_PARENS ()
#define HYBRIDRL_PP_EXPAND(...) HYBRIDRL_PP_EXPAND4(HYBRIDRL_PP_EXPAND4(HYBRIDRL_PP_EXPAND4(HYBRIDRL_PP_EXPAND4(__VA_ARGS__))))
#define HYBRIDRL_PP_EXPAND4(...) HYBRIDRL_PP_EXPAND3(HYBRIDRL_PP_EXPAND3(HYBRIDRL_PP_EXPAND3(HYBRIDRL_PP_EXPAND3(__VA_ARGS__))))
#define HYBRIDRL_PP_EXPAND3(...) HYBRIDRL_PP_EXPAND2(HYBRIDRL_PP_EXPAND2(HYBRIDRL_PP_EXPAND2(HYBRIDRL_PP_EXPAND2(__VA_ARGS__))))
#define HYBRIDRL_PP_EXPAND2(...) HYBRIDRL_PP_EXPAND1(HYBRIDRL_PP_EXPAND1(HYBRIDRL_PP_EXPAND1(HYBRIDRL_PP_EXPAND1(__VA_ARGS__))))
#define HYBRIDRL_PP_EXPAND1(...) __VA_ARGS__
/// Expands `macro(arg, x)` for each x of the list.
#define HYBRIDRL_PP_FOR_EACH(macro, arg, ...) \
  __VA_OPT__(HYBRIDRL_PP_EXPAND(HYBRIDRL_PP_FOR_EACH_HELPER(macro, arg, __VA_ARGS__)))
#define HYBRIDRL_PP_FOR_EACH_HELPER(macro, arg, a1, ...) \
  macro(arg, a1) __VA_OPT__(HYBRIDRL_PP_FOR_EACH_AGAIN HYBRIDRL_PP_PARENS(macro, arg, __VA_ARGS__))
#define HYBRIDRL_PP_FOR_EACH_AGAIN() HYBRIDRL_PP_FOR_EACH_HELPER

#define HYBRIDRL_PP_VISIT_FIELD(f, name) f(#name, self.name##_);

/// Lists the fields of an Options struct (declared with HYBRIDRL_ARG) for the field visitor.
#define HYBRIDRL_FIELDS(...)                                              \
  template <class Self, class F>                                          \
  static void visit_fields(Self& self, F&& f) {                           \
    (void)self;                                                           \
    (void)f;                                                              \
    HYBRIDRL_PP_FOR_EACH(HYBRIDRL_PP_VISIT_FIELD, f, __VA_ARGS__)         \
  }

namespace hybridrl {

/// An Options struct with a field visitor (HYBRIDRL_FIELDS).
template <class O>
concept reflectable_options = requires(O& o, const O& c) {
  O::visit_fields(o, [](std::string_view, auto&) {});
  O::visit_fields(c, [](std::string_view, const auto&) {});
};

/// Names of an enum's values, specialized once per enum with HYBRIDRL_ENUM_NAMES:
/// `static constexpr std::array<std::pair<E, std::string_view>, N> values`.
template <class E>
struct enum_names;

/// An enum whose values have names (round-trips through configuration files by name).
template <class E>
concept named_enum = std::is_enum_v<E> && requires { enum_names<E>::values; };

/// The name of `e` ("?" for a value without a name).
template <named_enum E>
[[nodiscard]] constexpr std::string_view enum_name(E e) noexcept {
  for (const auto& [v, n] : enum_names<E>::values) {
    if (v == e) return n;
  }
  return "?";
}

/// The value named `name`, or nullopt.
template <named_enum E>
[[nodiscard]] constexpr std::optional<E> enum_from_name(std::string_view name) noexcept {
  for (const auto& [v, n] : enum_names<E>::values) {
    if (n == name) return v;
  }
  return std::nullopt;
}

/// A seed for one consumer ("loader", "sampling", ...) derived from the run's one seed, so each
/// consumer draws an independent stream and the configuration has a single seed knob
/// (FNV-1a of the name mixed into the seed by SplitMix64's finalizer).
[[nodiscard]] constexpr uint64_t derive_seed(uint64_t run_seed, std::string_view consumer) noexcept {
  uint64_t h = 14695981039346656037ull;
  for (const char c : consumer) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  uint64_t z = run_seed + 0x9e3779b97f4a7c15ull * (h | 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

namespace detail {

/// Validates a nested Options member; a hybridrl::Error it throws gets "name." in front of its
/// problem, so the message carries the member's full dotted path.
template <class T>
void validate_member(const T& member, std::string_view name) {
  try {
    member.validate();
  } catch (const Error& e) {
    throw Error(std::string(name) + "." + e.problem(), e.fix());
  }
}

}  // namespace detail
}  // namespace hybridrl

#define HYBRIDRL_PP_ENUM_ENTRY(E, v) std::pair{E::v, std::string_view(#v)},

/// Names every value of enum `E` by its identifier; use at namespace scope inside hybridrl:
/// `HYBRIDRL_ENUM_NAMES(LossAgg, token_mean, seq_mean_token_sum, ...)`.
#define HYBRIDRL_ENUM_NAMES(E, ...)                                              \
  template <>                                                                    \
  struct enum_names<E> {                                                         \
    static constexpr std::array values{                                          \
        HYBRIDRL_PP_FOR_EACH(HYBRIDRL_PP_ENUM_ENTRY, E, __VA_ARGS__)};           \
  }
