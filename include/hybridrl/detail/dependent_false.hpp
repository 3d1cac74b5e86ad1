#pragma once
/// \file
/// `dependent_false<T>`: false, but only once T is known, so a primary template's static_assert
/// fires when that template is instantiated, not when it is parsed (as in CUTLASS's detail/).

namespace hybridrl::detail {

template <class...>
inline constexpr bool dependent_false = false;

}  // namespace hybridrl::detail
