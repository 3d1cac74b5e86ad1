// Includes every public header; linked with link/second.cpp (or first.cpp) into one program, so a
// non-inline function or variable defined in a header shows up as a duplicate symbol.
#include <hybridrl/hybridrl.hpp>

int link_probe_second() {
  hybridrl::TensorBatch b({{"x", at::arange(3)}});
  return static_cast<int>(b.repeat(2).size()) + static_cast<int>(hybridrl::device_info().cuda_device_count >= 0);
}
