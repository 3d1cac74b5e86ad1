// io/tensorboard.hpp: CRC32C against its standard check value, and the event file byte for byte
// against tests/fixtures/tensorboard/golden.tfevents, written by TensorBoard 2.21's own
// RecordWriter and Event protos (tests/fixtures/make_tensorboard_golden.py) with the same wall
// times, steps, tags and values.

#include <hybridrl/io/atomic_file.hpp>
#include <hybridrl/io/tensorboard.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <unistd.h>

#include "../support/tensors.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using hybridrl::testing::contains;
using hybridrl::testing::error_of;

namespace hybridrl::testing {
inline std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
}  // namespace hybridrl::testing

TEST_SUITE("io/tensorboard") {
  TEST_CASE("CRC32C: the standard check value, and TFRecord's mask") {
    CHECK(hybridrl::io::detail::crc32c("123456789") == 0xE3069283u);
    CHECK(hybridrl::io::detail::crc32c("") == 0u);
    const uint32_t c = 0xE3069283u;
    CHECK(hybridrl::io::detail::masked_crc32c("123456789") == ((c >> 15) | (c << 17)) + 0xA282EAD8u);
  }

  TEST_CASE("the event file equals TensorBoard's own writer's, byte for byte") {
    const auto dir = std::filesystem::temp_directory_path() / ("hybridrl_tb_" + std::to_string(getpid()));
    hybridrl::io::detail::remove_tree(dir.string());  // not remove_all: the pip wheels export a broken copy (docs/development.md)
    std::filesystem::path file;
    {
      hybridrl::io::TensorBoardWriter w(dir, 1700000000.25);
      file = w.path();
      w.add_scalars(0, {{"reward_mean", 0.5}, {"kl", 0.0}}, 1700000001.5);
      w.add_scalars(1, {{"reward_mean", 0.75}, {"time/generate", 1.25}}, 1700000002.75);
      w.add_scalars(7, {{"lr", 1e-6}, {"loss", -3.5}}, 1700000009.125);
      w.add_scalar("tokens_per_s", 31415.9265, 123456789, 1700000010.0);
    }
    CHECK(file.filename().string().rfind("events.out.tfevents.1700000000.", 0) == 0);
    const auto golden = hybridrl::testing::read_bytes(std::string(HYBRIDRL_FIXTURES_DIR) + "/tensorboard/golden.tfevents");
    REQUIRE(golden.size() == 372);
    CHECK(hybridrl::testing::read_bytes(file) == golden);
    // a second writer in the same second gets its own file
    hybridrl::io::TensorBoardWriter again(dir, 1700000000.25);
    CHECK(again.path() != file);
    hybridrl::io::detail::remove_tree(dir.string());  // not remove_all: the pip wheels export a broken copy (docs/development.md)
  }

  TEST_CASE("an unwritable directory is an Error naming the fix") {
    CHECK(contains(error_of([] { hybridrl::io::TensorBoardWriter w("/proc/hybridrl-no/tb"); }), "cannot create"));
  }
}
