// libFuzzer target: a run's configuration (core/options_yaml.hpp, core/config.hpp,
// trainer/run.hpp), as `hybridrl train --config run.yaml key=value ...` reads it. The input is
// the YAML file, then after a NUL the command line's overrides, one `key=value` a line. The file
// is written to a scratch directory and read by read_run_sources, which takes out algorithm.name;
// the configuration is then read onto the RunConfig of the preset that name picks (configure_run:
// every key and value checked, validated) and the trainer is constructed, as --print-config does.
// A configuration that validates must come back the same through to_yaml and from_yaml.
#include <hybridrl/core/config.hpp>
#include <hybridrl/core/options_yaml.hpp>
#include <hybridrl/trainer/presets.hpp>
#include <hybridrl/trainer/run.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.hpp"

namespace {

template <class T>
void configure_as(const hybridrl::ConfigSources& sources) {
  const auto cfg = hybridrl::configure_run<T>(sources);
  const T trainer(cfg.run(), 1);
  auto effective = cfg;
  effective.run(trainer.options());
  (void)hybridrl::describe(effective);
  // what the run saves (run_config.json, the checkpoint's config) reads back as itself
  const auto yaml = hybridrl::to_yaml(effective);
  try {
    hybridrl::RunConfig<T> back;
    hybridrl::from_yaml(yaml, back, "to_yaml");
    if (hybridrl::to_json(back) != hybridrl::to_json(effective)) {
      std::fprintf(stderr, "to_yaml/from_yaml changed the configuration:\n%s", yaml.c_str());
      std::abort();
    }
  } catch (const hybridrl::Error& e) {
    std::fprintf(stderr, "to_yaml wrote a configuration that does not read back: %s\n%s", e.what(), yaml.c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fuzz = hybridrl::fuzz;
  const auto parts = fuzz::split_at_nul(fuzz::bytes_of(data, size), 1);
  const auto path = fuzz::scratch_dir() / "run.yaml";
  fuzz::write_file(path, parts[0]);
  std::vector<std::string> overrides;
  for (std::string_view rest = parts[1]; !rest.empty();) {
    const auto nl = rest.find('\n');
    overrides.emplace_back(rest.substr(0, nl));
    rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
  }
  try {
    const auto s = hybridrl::read_run_sources(path.string(), overrides);
    if (s.algorithm == "ppo") {
      configure_as<hybridrl::PPOTrainer>(s.sources);
    } else if (s.algorithm == "dpo") {
      configure_as<hybridrl::DPOTrainer>(s.sources);
    } else if (s.algorithm == "kto") {
      configure_as<hybridrl::KTOTrainer>(s.sources);
    } else if (s.algorithm == "sft") {
      configure_as<hybridrl::SFTTrainer>(s.sources);
    } else {
      configure_as<hybridrl::GRPOTrainer>(s.sources);
    }
  } catch (const hybridrl::Error&) {
  }
  return 0;
}
