#pragma once
/// \file
/// What a run writes as it goes: `metrics.jsonl` (one JSON object per step, keys sorted, `step`
/// first), TensorBoard scalars under `tensorboard/`, the plot `metrics.svg`, and a progress line
/// (step/total, seconds per step, ETA, reward or loss). A resumed run keeps the lines of the steps
/// its checkpoint covers and drops later ones (they are recomputed), so the file of a resumed run
/// equals the uninterrupted run's.

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hybridrl/core/error.hpp"
#include "hybridrl/io/atomic_file.hpp"
#include "hybridrl/io/svg_plot.hpp"
#include "hybridrl/io/tensorboard.hpp"

namespace hybridrl {

/// The series the plot shows when a run has them, in this order (others are in metrics.jsonl).
inline const std::vector<std::string>& plotted_metrics() {
  static const std::vector<std::string> names{"reward_mean", "kl",   "entropy", "response_length_mean",
                                              "loss",        "grad_norm", "lr"};
  return names;
}

/// `"1h02m"`, `"3m20s"`, `"12s"`.
inline std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  if (s >= 3600) return fmt::format("{}h{:02d}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

/// Writes a run's metrics (see the file comment). Without a directory it only keeps the history
/// and prints the progress line.
class RunLog {
 public:
  struct Options {
    std::string dir;                 ///< output directory; empty: nothing is written
    int64_t total_steps = 0;         ///< for the progress line's fraction and ETA
    int64_t resumed_step = 0;        ///< steps a checkpoint covers (their lines are kept)
    int64_t log_every = 1;           ///< progress line interval; 0: none
    int64_t plot_every = 0;          ///< plot interval; 0: at the end only (write_plot)
    bool tensorboard = true;
    std::FILE* progress = stderr;    ///< where the progress line goes (nullptr: nowhere)
  };

  explicit RunLog(Options o) : o_(std::move(o)), start_(clock::now()) {
    if (o_.dir.empty()) return;
    std::error_code ec;
    std::filesystem::create_directories(o_.dir, ec);
    HYBRIDRL_CHECK(!ec, fmt::format("cannot create the output directory '{}': {}", o_.dir, ec.message()),
                   "choose a writable trainer.output_dir");
    const auto path = metrics_path();
    // keep the lines of the steps the checkpoint covers, rewritten atomically; drop later ones
    std::string kept;
    if (std::filesystem::exists(path)) {
      std::ifstream in(path);
      std::string line;
      int64_t n = 0;
      while (std::getline(in, line)) {
        ++n;
        if (line.empty()) continue;
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception&) {
          break;  // a line cut by a crash: it and what follows are recomputed
        }
        if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) break;
        const auto step = j["step"].get<int64_t>();
        if (step > o_.resumed_step) break;
        kept += line + "\n";
        remember(step, j);
      }
    }
    io::write_file_atomic(path, kept);
    file_ = std::fopen(path.c_str(), "ab");
    HYBRIDRL_CHECK(file_ != nullptr, fmt::format("cannot open '{}' for appending", path),
                   "check permissions of trainer.output_dir");
    if (o_.tensorboard) tb_ = std::make_unique<io::TensorBoardWriter>(std::filesystem::path(o_.dir) / "tensorboard");
  }
  RunLog(const RunLog&) = delete;
  RunLog& operator=(const RunLog&) = delete;
  ~RunLog() {
    if (file_ != nullptr) std::fclose(file_);
  }

  /// Records step `step`: a metrics.jsonl line (flushed), TensorBoard scalars, the plot's history,
  /// and the progress line when due. Non-finite values are written as null.
  void log(int64_t step, const std::map<std::string, double>& metrics) {
    nlohmann::ordered_json j;
    j["step"] = step;
    for (const auto& [k, v] : metrics) {
      if (k == "step") continue;
      if (std::isfinite(v)) {
        j[k] = v;
      } else {
        j[k] = nullptr;
      }
    }
    if (file_ != nullptr) {
      const auto line = j.dump() + "\n";
      HYBRIDRL_CHECK(std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0,
                     fmt::format("cannot write '{}'", metrics_path()), "check free disk space");
    }
    if (tb_) {
      std::vector<std::pair<std::string, double>> scalars(metrics.begin(), metrics.end());
      tb_->add_scalars(step, scalars);
    }
    remember(step, nlohmann::json(j));
    ++logged_;
    if (o_.progress != nullptr && o_.log_every > 0 && (step % o_.log_every == 0 || step == o_.total_steps)) {
      std::fprintf(o_.progress, "%s\n", progress_line(step, metrics).c_str());
      std::fflush(o_.progress);
    }
    if (o_.plot_every > 0 && step % o_.plot_every == 0) write_plot();
  }

  /// `step 12/100 (12%) | 2.31 s/step | ETA 3m23s | reward 0.531 | loss 0.4102`: the rate over
  /// this process's steps; the reward (online) or the loss, when the metrics have one.
  [[nodiscard]] std::string progress_line(int64_t step, const std::map<std::string, double>& m) const {
    const double elapsed = std::chrono::duration<double>(clock::now() - start_).count();
    const double rate = logged_ > 0 ? elapsed / static_cast<double>(logged_) : NAN;
    std::string out;
    if (o_.total_steps > 0) {
      out = fmt::format("step {}/{} ({:.0f}%) | {:.2f} s/step | ETA {}", step, o_.total_steps,
                        100.0 * static_cast<double>(step) / static_cast<double>(o_.total_steps), rate,
                        format_duration(rate * static_cast<double>(o_.total_steps - step)));
    } else {
      out = fmt::format("step {} | {:.2f} s/step", step, rate);
    }
    for (const char* k : {"reward_mean", "loss", "kl"}) {
      auto it = m.find(k);
      if (it != m.end()) out += fmt::format(" | {} {:.4g}", k, it->second);
    }
    return out;
  }

  /// Writes `metrics.svg` (atomically): the plotted metrics the run has, over its steps.
  void write_plot() const {
    if (o_.dir.empty()) return;
    std::vector<io::PlotSeries> series;
    for (const auto& name : plotted_metrics()) {
      auto it = history_.find(name);
      if (it != history_.end() && !it->second.empty()) series.push_back({name, it->second});
    }
    if (!series.empty()) io::write_svg_plot((std::filesystem::path(o_.dir) / "metrics.svg").string(), series);
  }

  /// (step, value) of metric `name` over the steps logged (kept lines of a resumed run included).
  [[nodiscard]] std::vector<std::pair<double, double>> history(const std::string& name) const {
    auto it = history_.find(name);
    return it == history_.end() ? std::vector<std::pair<double, double>>{} : it->second;
  }

  [[nodiscard]] std::string metrics_path() const { return (std::filesystem::path(o_.dir) / "metrics.jsonl").string(); }

 private:
  using clock = std::chrono::steady_clock;

  void remember(int64_t step, const nlohmann::json& j) {
    for (const auto& name : plotted_metrics()) {
      auto it = j.find(name);
      if (it == j.end()) continue;
      history_[name].emplace_back(static_cast<double>(step), it->is_number() ? it->get<double>() : NAN);
    }
  }

  Options o_;
  clock::time_point start_;
  std::FILE* file_ = nullptr;
  std::unique_ptr<io::TensorBoardWriter> tb_;
  std::map<std::string, std::vector<std::pair<double, double>>> history_;
  int64_t logged_ = 0;
};

}  // namespace hybridrl
