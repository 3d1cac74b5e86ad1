// io/atomic_file.hpp and io/json.hpp: atomic file and directory writes (content, no temporary
// left on failure, two threads on one path never interleave) and bounded JSON parsing.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fcntl.h>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "hybridrl/io/atomic_file.hpp"
#include "hybridrl/io/json.hpp"
#include "../support/tensors.hpp"
#include "../support/doctest.hpp"  // last: after LibTorch (c10 has a CHECK macro too)

using namespace hybridrl;
using namespace hybridrl::testing;

namespace {

/// A fresh scratch directory, removed at scope exit.
struct Scratch {
  std::string path;
  explicit Scratch(const std::string& tag)
      : path("/tmp/hybridrl_io_" + tag + "_" + std::to_string(::getpid())) {
    io::detail::remove_tree(path);
    ::mkdir(path.c_str(), 0755);
  }
  ~Scratch() { io::detail::remove_tree(path); }
};

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (auto* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") out.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}


}  // namespace

TEST_SUITE("io/atomic_file") {
  TEST_CASE("write_file_atomic: content replaces the old file, keeps its mode, leaves no temporary") {
    Scratch s("content");
    const auto p = s.path + "/a.txt";
    io::write_file_atomic(p, "first");
    CHECK(slurp(p) == "first");
    ::chmod(p.c_str(), 0600);
    io::write_file_atomic(p, std::string("sec\0ond", 7));
    CHECK(slurp(p) == std::string("sec\0ond", 7));
    struct stat st {};
    REQUIRE(::stat(p.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
    CHECK(entries(s.path) == std::vector<std::string>{"a.txt"});
  }

  TEST_CASE("failure paths: missing directory, target is a directory, exception before commit") {
    Scratch s("fail");
    CHECK(error_of([&] { io::write_file_atomic(s.path + "/no/such/dir/x", "x"); }).find("cannot create") !=
          std::string::npos);
    ::mkdir((s.path + "/target").c_str(), 0755);
    ::close(::open((s.path + "/target/keep").c_str(), O_CREAT | O_WRONLY, 0644));  // non-empty dir
    const auto msg = error_of([&] { io::write_file_atomic(s.path + "/target", "x"); });
    CHECK(msg.find("renaming") != std::string::npos);
    CHECK(entries(s.path) == std::vector<std::string>{"target"});  // the temporary is gone
    try {
      io::AtomicFile f(s.path + "/b.txt");
      f.write("partial");
      CHECK(entries(s.path).size() == 2);  // target + the temporary
      throw std::runtime_error("interrupted");
    } catch (const std::runtime_error&) {
    }
    CHECK(entries(s.path) == std::vector<std::string>{"target"});
  }

  TEST_CASE("a planted symlink at a temporary-looking name is never followed") {
    Scratch s("symlink");
    const auto victim = s.path + "/victim";
    io::write_file_atomic(victim, "safe");
    // Whatever the temporary's name, O_EXCL|O_NOFOLLOW refuses to open an existing entry; plant
    // links at the old fixed names the previous writers used.
    REQUIRE(::symlink(victim.c_str(), (s.path + "/out.tmp").c_str()) == 0);
    REQUIRE(::symlink(victim.c_str(), (s.path + "/out.tmp." + std::to_string(::getpid())).c_str()) == 0);
    io::write_file_atomic(s.path + "/out", "new");
    CHECK(slurp(victim) == "safe");
    CHECK(slurp(s.path + "/out") == "new");
  }

  TEST_CASE("two threads writing one path: every result is one writer's whole content") {
    Scratch s("threads");
    const auto p = s.path + "/shared.bin";
    const std::string a(1 << 20, 'a'), b(1 << 20, 'b');
    bool mixed = false;
    for (int round = 0; round < 10; ++round) {
      std::thread t1([&] { for (int i = 0; i < 5; ++i) io::write_file_atomic(p, a); });
      std::thread t2([&] { for (int i = 0; i < 5; ++i) io::write_file_atomic(p, b); });
      t1.join();
      t2.join();
      const auto got = slurp(p);
      mixed = mixed || !(got == a || got == b);
    }
    CHECK_FALSE(mixed);
    CHECK(entries(s.path) == std::vector<std::string>{"shared.bin"});
  }

  TEST_CASE("AtomicDirectory: built aside, swapped in whole, old tree removed; discarded on failure") {
    Scratch s("dir");
    const auto target = s.path + "/ckpt";
    {
      io::AtomicDirectory d(target);
      io::write_file_atomic(d.temp_path() + "/state", "one");
      CHECK(entries(s.path).size() == 1);
      CHECK(entries(s.path)[0] != "ckpt");
      d.commit();
    }
    CHECK(slurp(target + "/state") == "one");
    {
      io::AtomicDirectory d(target);
      io::write_file_atomic(d.temp_path() + "/state2", "two");
      d.commit();
    }
    CHECK(entries(target) == std::vector<std::string>{"state2"});
    CHECK(entries(s.path) == std::vector<std::string>{"ckpt"});
    {
      io::AtomicDirectory d(target);
      io::write_file_atomic(d.temp_path() + "/state3", "three");
    }  // no commit: the temporary tree goes, the target stays
    CHECK(entries(s.path) == std::vector<std::string>{"ckpt"});
    CHECK(entries(target) == std::vector<std::string>{"state2"});
  }
}

TEST_SUITE("io/json") {
  TEST_CASE("HYBRIDRL_FAULT: the fault tests' injection spec parses, and a mistyped one is an Error") {
    const auto k = io::fault::parse("kill:trainer_state.safetensors:3");
    CHECK((k.action == io::fault::Action::kill));
    CHECK(k.path_part == "trainer_state.safetensors");
    CHECK(k.nth == 3);
    const auto e = io::fault::parse("enospc:step_00000002/model");
    CHECK((e.action == io::fault::Action::enospc));
    CHECK(e.path_part == "step_00000002/model");
    CHECK(e.nth == 1);
    const auto err = [](const char* v) {
      try {
        (void)io::fault::parse(v);
      } catch (const Error& x) {
        return std::string(x.what());
      }
      return std::string("(no error)");
    };
    CHECK(err("kill").find("has no ':'") != std::string::npos);
    CHECK(err("crash:x").find("'crash' is not an action") != std::string::npos);
    CHECK(err("kill:x:0").find("'0' is not a count >= 1") != std::string::npos);
    CHECK(err("kill:x:2b").find("'2b' is not a count >= 1") != std::string::npos);
    CHECK(err("enospc::4").find("names no path part") != std::string::npos);
    // not set in the test's environment: no file gets a fault
    CHECK_FALSE(io::fault::for_file("/tmp/model.safetensors").has_value());
  }

  TEST_CASE("parse_json: deep nesting, NUL, duplicate keys and 1e400 are errors, not crashes") {
    const std::string deep = std::string(200000, '[') + std::string(200000, ']');
    auto r = io::parse_json(deep);
    CHECK_FALSE(r);
    CHECK(r.error.find("nesting deeper than 64") != std::string::npos);
    // 64 levels pass, 65 do not (depth counts the containers around a value)
    CHECK(static_cast<bool>(io::parse_json(std::string(64, '[') + std::string(64, ']'))));
    CHECK_FALSE(io::parse_json(std::string(65, '[') + std::string(65, ']')));
    auto nul = io::parse_json(std::string("{\"a\":1}\0{\"b\":2}", 15));
    CHECK(nul.error.find("NUL byte at offset 7") != std::string::npos);
    CHECK(static_cast<bool>(io::parse_json(R"({"a":1,"a":2})")));  // lenient by default: last wins
    auto dup = io::parse_json(R"({"x":{"a":1,"a":2}})", io::JSONLimits{.unique_keys = true});
    CHECK(dup.error.find("\"a\" appears twice") != std::string::npos);
    CHECK(static_cast<bool>(io::parse_json(R"({"a":{"k":1},"b":{"k":2}})", io::JSONLimits{.unique_keys = true})));
    CHECK_FALSE(io::parse_json(R"({"x": 1e400})"));
    CHECK_FALSE(io::parse_json(R"({"x": 1} trailing)"));
    CHECK(io::parse_json(R"({"x": [1, 2]}   )").value["x"][1] == 2);
  }

  TEST_CASE("brief: one level, at most 8 elements") {
    auto j = nlohmann::json::parse(R"([1, [2, [3]], "s", {"k": 1}, 5, 6, 7, 8, 9, 10])");
    CHECK(io::brief(j) == R"([1, [...], "s", {...}, 5, 6, 7, 8, ...])");
    CHECK(io::brief(nlohmann::json(-3)) == "-3");
  }

  TEST_CASE("read_text_file: a directory is an Error, not an escaping ios_base::failure") {
    Scratch s("read");
    CHECK(error_of([&] { (void)io::read_text_file(s.path, "config"); }).find("reading config") !=
          std::string::npos);
    io::write_file_atomic(s.path + "/f", "hello");
    CHECK(io::read_text_file(s.path + "/f", "config") == "hello");
  }
}
