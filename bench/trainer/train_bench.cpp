// Training benchmarks on the GPU (a bench program like bench_rollout; built where CUDA is on).
// Prints one JSON object per measurement. Random-init Llama configs of ../shared/bench/hf_baseline.py.
//   bench_train update 160m|1b [micro]   (BENCH_KEEP_PARAM_COPY=0: FSDPOptions::keep_param_copy off)
//                                        the policy update alone: forward + backward + AdamW of
//                                        16 × 1024 tokens through Sharding<FSDP> (fp32 master, bf16
//                                        compute), `micro` sequences per micro-batch (default 16);
//                                        tokens/s and MFU (6 · params · tokens / time / 989 TFLOP/s,
//                                        the peer's formula), peak memory. 3 warm-up steps, then 5
//                                        timed back to back as the peer times its steps (step_s;
//                                        the phases from CUDA events), then 5 with the device
//                                        synchronised after each phase (step_synced_s)
//   bench_train grpo 160m|1b [steps [fixed_micro]]
//                                        GRPOTrainer (Rollout<Paged>, Sharding<FSDP>) steps of 64
//                                        prompts × 8 samples, prompt 128 random tokens, 256 new
//                                        tokens (EOS ignored), one update per step: each step's
//                                        phase times, per-phase peak memory and the micro-batch
//                                        sizes the sizer chose (the first step captures the CUDA
//                                        graphs and measures memory: read the later ones);
//                                        `fixed_micro` > 0 turns the sizer off for that size;
//                                        BENCH_OVERRIDES="k=v k=v" adds configuration overrides
//   bench_train profile update|grpo 160m|1b TRACE.json [micro]
//                                        the same under the Kineto profiler (the update's timed
//                                        steps; the GRPO run's second step): GPU time per kernel
//                                        class and per kernel, the busy fraction, a Chrome trace
// The peers are bench/peers/update_peer.py and bench/peers/grpo_step_peer.py (transformers + torch,
// same shapes), run in the same job by scripts/gpu_bench.sh; see docs/benchmarks.md.
#include <hybridrl/hybridrl.hpp>
#include <hybridrl/trainer/run.hpp>

#include "../support/kernel_profile.hpp"
#include "../support/llama_configs.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <ucontext.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#if defined(HYBRIDRL_WITH_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

using namespace hybridrl;

namespace {

using bench::llama;  // bench/support/llama_configs.hpp

at::Device device() { return at::hasCUDA() ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU); }

void sync() {
#if defined(HYBRIDRL_WITH_CUDA)
  cudaDeviceSynchronize();
#endif
}

double peak_gb() {
  return hybridrl::detail::memory_use(device()).peak_gb;
}

// `profile`: record the timed steps' kernels (bench/support/kernel_profile.hpp) and save the trace there
int bench_update(const std::string& name, int64_t micro, const std::string& profile = {}) {
  const auto c = llama(name);
  at::manual_seed(0);
  CausalLM m(c);
  m->to(device());
  int64_t params = 0;
  for (const auto& p : m->parameters()) params += p.numel();
  // BENCH_KEEP_PARAM_COPY=0: cast each unit at every gather (FSDPOptions::keep_param_copy off)
  const char* keep = std::getenv("BENCH_KEEP_PARAM_COPY");
  auto e = Sharding<FSDP>::make(m, FSDPOptions{}.keep_param_copy(keep == nullptr || std::string_view(keep) != "0"),
                                OptimizerOptions{}.lr(1e-5), 100);
  auto lpo = LogProbOptions{}.with_entropy(false);
  e.set_log_prob_options(lpo);
  const int64_t B = 16, T = 1024;
  const auto ids = at::randint(100, c.vocab_size, {B, T}, at::TensorOptions().dtype(at::kLong).device(device()));
  const TensorBatch batch({{keys::input_ids.str(), ids}, {keys::attention_mask.str(), at::ones_like(ids)}});
  using clock = std::chrono::steady_clock;
  // forward + backward of every micro-batch, then the optimizer step; `mark(i)` between the phases
  auto step = [&](auto&& mark) {
    mark(0);
    for (const auto& mb : batch.split(micro)) {
      const auto out = e.forward(mb);
      const auto loss = -out.tensor(keys::log_probs).mean() * (static_cast<double>(mb.size()) / static_cast<double>(B));
      e.backward(loss);
    }
    mark(1);
    e.step();
    mark(2);
  };
  for (int i = 0; i < 3; ++i) step([](int) {});
  sync();
  hybridrl::detail::compat::reset_cuda_peak(0);
  constexpr int reps = 5;
  // 1. as the peer times its steps: back to back, one synchronisation after the last; the phases
  //    from CUDA events recorded between them (no host wait inside the timed steps)
  double t_fb = 0, t_opt = 0;
  const auto w0 = clock::now();
  if (!profile.empty()) bench::start_kernel_profile();
#if defined(HYBRIDRL_WITH_CUDA)
  std::vector<cudaEvent_t> ev(3 * reps);
  for (auto& x : ev) cudaEventCreate(&x);
  for (int i = 0; i < reps; ++i) step([&](int k) { cudaEventRecord(ev[3 * i + k], at::cuda::getCurrentCUDAStream()); });
  sync();
  for (int i = 0; i < reps; ++i) {
    float a = 0, b = 0;
    cudaEventElapsedTime(&a, ev[3 * i], ev[3 * i + 1]);
    cudaEventElapsedTime(&b, ev[3 * i + 1], ev[3 * i + 2]);
    t_fb += a * 1e-3, t_opt += b * 1e-3;
  }
  for (auto& x : ev) cudaEventDestroy(x);
#else
  for (int i = 0; i < reps; ++i) step([](int) {});
#endif
  const double wall = std::chrono::duration<double>(clock::now() - w0).count();
  if (!profile.empty()) bench::stop_kernel_profile(fmt::format("update {} micro {}", name, micro), reps, wall * 1e3, 40, profile);
  // 2. as this benchmark timed them before 2026-12-07: the device synchronised after the
  //    backward and after the step (the host's launch latency after each wait counted in)
  double s_fb = 0, s_opt = 0;
  for (int i = 0; i < reps; ++i) {
    clock::time_point a, b;
    step([&](int k) {
      sync();
      const auto now = clock::now();
      if (k == 0) a = now;
      if (k == 1) s_fb += std::chrono::duration<double>(now - a).count(), b = now;
      if (k == 2) s_opt += std::chrono::duration<double>(now - b).count();
    });
  }
  const double dt = wall / reps;
  const double tokens = static_cast<double>(B * T);
  std::printf("{\"bench\": \"update\", \"engine\": \"hybridrl FSDP (fp32 master, bf16 compute)\", \"model\": \"%s\", "
              "\"params\": %lld, \"tokens\": %.0f, \"micro_batch\": %lld, \"step_s\": %.4f, \"tokens_per_s\": %.1f, "
              "\"mfu\": %.4f, \"forward_backward_s\": %.4f, \"optimizer_s\": %.4f, \"step_synced_s\": %.4f, "
              "\"mfu_synced\": %.4f, \"peak_gb\": %.2f}\n",
              name.c_str(), static_cast<long long>(params), tokens, static_cast<long long>(micro), dt, tokens / dt,
              6.0 * static_cast<double>(params) * tokens / dt / 989e12, t_fb / reps, t_opt / reps,
              (s_fb + s_opt) / reps, 6.0 * static_cast<double>(params) * tokens / ((s_fb + s_opt) / reps) / 989e12,
              peak_gb());
  std::fflush(stdout);
  return 0;
}

// prompts are written as token ids ("17 923 4 ..."); this tokenizer reads them back
struct IdTokenizer {
  int64_t vocab = 32000;
  [[nodiscard]] std::vector<int64_t> encode(std::string_view text, bool) const {
    std::vector<int64_t> ids;
    std::istringstream in{std::string(text)};
    for (int64_t x; in >> x;) ids.push_back(x);
    return ids;
  }
  [[nodiscard]] std::string decode(const std::vector<int64_t>& ids) const {
    std::string s;
    for (auto x : ids) s += std::to_string(x) + " ";
    return s;
  }
  [[nodiscard]] int64_t vocab_size() const { return vocab; }
  [[nodiscard]] int64_t bos_id() const { return 1; }
  [[nodiscard]] int64_t eos_id() const { return 2; }
  [[nodiscard]] int64_t pad_id() const { return 0; }
};

// `profile`: record the second step's kernels (the first captures CUDA graphs) and save the trace there
// `fixed_micro` > 0: that micro-batch size always (geometry.adaptive_micro_batch=false); 0: the sizer's
int bench_grpo(const std::string& name, int64_t steps, const std::string& profile = {}, int64_t fixed_micro = 0) {
  const auto c = llama(name);
  const bool tiny = name == "tiny";  // a CPU smoke test of the program
  const int64_t prompts = tiny ? 4 : 64, n = tiny ? 2 : 8, P = tiny ? 8 : 128, G = tiny ? 8 : 256;
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("hybridrl_grpo_bench_{}", name);
  // not std::filesystem::remove_all: the LibTorch 2.x pip wheels export a copy of it that jumps to
  // address 0 on a directory with files (what made this program crash at exit and, when an earlier
  // run had left its directory, at start)
  io::detail::remove_tree(dir.string());
  std::vector<std::string> args{
      "model.init=tiny", "task.name=reverse", fmt::format("data.train_batch_size={}", prompts), fmt::format("rollout.n={}", n),
      fmt::format("rollout.max_new_tokens={}", G), "rollout.ignore_eos=true", "rollout.temperature=1.0",
      fmt::format("rollout.max_num_seqs={}", prompts * n), "rollout.max_num_batched_tokens=16384",
      fmt::format("geometry.ppo_mini_batch_size={}", prompts), fmt::format("geometry.micro_batch_size_per_gpu={}", fixed_micro > 0 ? fixed_micro : (tiny ? 4 : 32)),
      fmt::format("geometry.adaptive_micro_batch={}", fixed_micro > 0 ? "false" : "true"),
      fmt::format("trainer.total_steps={}", steps), fmt::format("trainer.output_dir={}", dir.string()),
      "trainer.save_model=false", "trainer.tensorboard=false", "optim.lr=1e-6", "loader.epochs=0"};
  if (const char* extra = std::getenv("BENCH_OVERRIDES")) {  // more key=value overrides, space-separated
    std::istringstream words(extra);
    for (std::string w; words >> w;) args.push_back(w);
  }
  ConfigSources src;
  src.overrides = args;
  const auto cfg = configure_run<GRPOTrainer>(src);
  std::string jsonl;
  at::manual_seed(1);
  for (int64_t i = 0; i < prompts * steps; ++i) {
    auto ids = at::randint(100, c.vocab_size, {P}, at::kLong);
    std::string text;
    for (int64_t t = 0; t < P; ++t) text += std::to_string(ids[t].item<int64_t>()) + " ";
    jsonl += fmt::format("{{\"prompt\": \"{}\"}}\n", text);
  }
  std::istringstream in(jsonl);
  auto data = PromptDataset::from_stream(in, "<bench>", IdTokenizer{}, DatasetOptions{}.add_bos(false));
  at::manual_seed(0);
  CausalLM policy(c);
  policy->to(device());
  int64_t params = 0;
  for (const auto& p : policy->parameters()) params += p.numel();
  // a reward that varies between the samples of a group: the share of even response ids
  RewardFn reward = [](const RewardInput& r) {
    int64_t even = 0;
    for (auto t : r.response_ids) even += t % 2 == 0 ? 1 : 0;
    return static_cast<double>(even) / static_cast<double>(std::max<size_t>(r.response_ids.size(), 1));
  };
  FitParts parts;
  std::chrono::steady_clock::time_point profile_start;
  parts.rollout_dtype = at::kBFloat16;
  parts.on_step = [&](int64_t step, const std::map<std::string, double>& m) {
    std::string s = fmt::format("{{\"bench\": \"grpo_step\", \"engine\": \"hybridrl GRPOTrainer\", \"model\": \"{}\", "
                                "\"params\": {}, \"prompts\": {}, \"n\": {}, \"step\": {}, \"unix_time\": {:.3f}",
                                name, params, prompts, n, step,
                                std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
    for (const auto& [k, v] : m) {
      if (k.rfind("time/", 0) == 0 || k.rfind("memory/", 0) == 0 || k.rfind("rollout/", 0) == 0 ||
          k.rfind("geometry/", 0) == 0 || k == "tokens_per_s") {
        s += fmt::format(", \"{}\": {:.5g}", k, v);
      }
    }
    std::printf("%s}\n", s.c_str());
    std::fflush(stdout);
    if (!profile.empty() && step == 1) {  // steps count from 1: record step 2
      sync();
      bench::start_kernel_profile();
      profile_start = std::chrono::steady_clock::now();
    } else if (!profile.empty() && step == 2) {
      sync();
      bench::stop_kernel_profile(fmt::format("grpo {} step 2", name), 1,
                                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - profile_start).count(),
                                 40, profile);
    }
  };
  GRPOTrainer trainer(cfg.run());
  trainer.fit(policy, std::make_shared<const PromptDataset>(std::move(data)), batched(reward), parts);
  io::detail::remove_tree(dir.string());
  return 0;
}

// a crash prints where it happened (the executable links with -rdynamic): the faulting
// instruction from the signal's context (backtrace() stops at the signal frame) with the object
// and symbol dladdr finds for it, then the handler's own backtrace, before dying of the signal
void on_crash(int sig, siginfo_t* info, void* context) {
  char line[512];
  void* pc = nullptr;
#if defined(__x86_64__)
  pc = reinterpret_cast<void*>(static_cast<ucontext_t*>(context)->uc_mcontext.gregs[REG_RIP]);
#else
  (void)context;
#endif
  Dl_info where{};
  const bool found = pc != nullptr && dladdr(pc, &where) != 0;
  const int n0 = std::snprintf(line, sizeof line, "bench_train: signal %d at %p (fault address %p) in %s (%s+%#lx)\n", sig, pc,
                               info != nullptr ? info->si_addr : nullptr, found && where.dli_fname ? where.dli_fname : "?",
                               found && where.dli_sname ? where.dli_sname : "?",
                               found ? static_cast<unsigned long>(static_cast<char*>(pc) - static_cast<char*>(where.dli_fbase)) : 0UL);
  [[maybe_unused]] auto w0 = write(STDERR_FILENO, line, static_cast<size_t>(n0 > 0 ? n0 : 0));
#if defined(__x86_64__)
  // a jump to a null or bad address leaves no frame to unwind: the words at the top of the stack
  // that point into code (the return address of the call that jumped first) say who called
  const auto* sp = reinterpret_cast<void* const*>(static_cast<ucontext_t*>(context)->uc_mcontext.gregs[REG_RSP]);
  for (int i = 0; i < 48; ++i) {
    Dl_info d{};
    if (dladdr(sp[i], &d) == 0 || d.dli_fname == nullptr) continue;
    const int k = std::snprintf(line, sizeof line, "bench_train:   stack[%d] %p in %s (%s+%#lx)\n", i, sp[i], d.dli_fname,
                                d.dli_sname != nullptr ? d.dli_sname : "?",
                                static_cast<unsigned long>(static_cast<const char*>(sp[i]) - static_cast<const char*>(
                                    d.dli_saddr != nullptr ? d.dli_saddr : d.dli_fbase)));
    [[maybe_unused]] auto wk = write(STDERR_FILENO, line, static_cast<size_t>(k > 0 ? k : 0));
  }
#endif
  void* frames[64];
  const int n = backtrace(frames, 64);
  constexpr char head[] = "bench_train: crashed; backtrace:\n";
  [[maybe_unused]] auto w = write(STDERR_FILENO, head, sizeof(head) - 1);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

int main(int argc, char** argv) {
  struct sigaction sa {};
  sa.sa_sigaction = on_crash;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &sa, nullptr);
  sigaction(SIGABRT, &sa, nullptr);
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "update" && argc > 2) return bench_update(argv[2], argc > 3 ? std::stoll(argv[3]) : 16);
    if (mode == "grpo" && argc > 2) {
      return bench_grpo(argv[2], argc > 3 ? std::stoll(argv[3]) : 3, {}, argc > 4 ? std::stoll(argv[4]) : 0);
    }
    if (mode == "profile" && argc > 4 && std::string(argv[2]) == "update") {
      return bench_update(argv[3], argc > 5 ? std::stoll(argv[5]) : 16, argv[4]);
    }
    if (mode == "profile" && argc > 4 && std::string(argv[2]) == "grpo") return bench_grpo(argv[3], 3, argv[4]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_train: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr,
               "usage: bench_train update 160m|1b [micro] | grpo 160m|1b [steps [fixed_micro]] | profile update 160m|1b TRACE.json [micro]"
               " | profile grpo 160m|1b TRACE.json\n");
  return 2;
}
