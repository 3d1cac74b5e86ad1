#pragma once
/// \file
/// Options structs: runtime numbers with chainable setters, as in the PyTorch C++ frontend.
///
/// `HYBRIDRL_ARG(T, name) = default;` declares a field `name_` with a getter `name()` and a
/// chainable setter `name(value)`, so users write `PPOOptions{}.clip_low(0.2).clip_high(0.28)`.
/// Unlike TORCH_ARG it leaves the struct's access public, so `validate()` may follow the fields.
/// Every Options struct has `void validate() const` that throws hybridrl::Error naming the field.

#include <utility>

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
