#pragma once
/// \file
/// A training-curves plot as a standalone SVG file (a browser opens it; no plotting library): one
/// panel per series (reward, KL, entropy, response length, ...) in a grid, each with its own
/// axes, min / max labels and a polyline of (step, value). Non-finite values are left out (a
/// skipped step leaves a gap, not a spike). Written atomically (io/atomic_file.hpp).

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "hybridrl/io/atomic_file.hpp"

namespace hybridrl::io {

/// One plotted series: a title and its (step, value) points in step order.
struct PlotSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;
};

/// Geometry of the plot (pixels).
struct PlotLayout {
  int columns = 2;
  double panel_width = 420, panel_height = 260, margin = 48;
};

namespace detail {
inline std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}
inline std::string number_label(double v) { return fmt::format("{:.4g}", v); }
}  // namespace detail

/// The SVG document of `series` (panels left to right, top to bottom).
inline std::string svg_plot(const std::vector<PlotSeries>& series, const PlotLayout& layout = {}) {
  const int cols = std::max(1, layout.columns);
  const int rows = std::max(1, static_cast<int>((series.size() + static_cast<size_t>(cols) - 1) / static_cast<size_t>(cols)));
  const double W = layout.panel_width, H = layout.panel_height, m = layout.margin;
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:g}\" height=\"{:g}\" viewBox=\"0 0 {:g} {:g}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      W * cols, H * rows, W * cols, H * rows);
  for (size_t i = 0; i < series.size(); ++i) {
    const auto& s = series[i];
    const double x0 = W * static_cast<double>(static_cast<int>(i) % cols), y0 = H * static_cast<double>(static_cast<int>(i) / cols);
    const double left = x0 + m, right = x0 + W - m / 2, top = y0 + m / 2, bottom = y0 + H - m;
    double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      xmin = std::min(xmin, x);
      xmax = std::max(xmax, x);
      ymin = std::min(ymin, y);
      ymax = std::max(ymax, y);
    }
    svg += fmt::format("<g class=\"panel\">\n<text x=\"{:g}\" y=\"{:g}\" font-weight=\"bold\">{}</text>\n", left,
                       top - 6, detail::xml_escape(s.name));
    svg += fmt::format("<rect x=\"{:g}\" y=\"{:g}\" width=\"{:g}\" height=\"{:g}\" fill=\"none\" stroke=\"#888\"/>\n",
                       left, top, right - left, bottom - top);
    if (!std::isfinite(xmin)) {
      svg += fmt::format("<text x=\"{:g}\" y=\"{:g}\" fill=\"#888\">no data</text>\n</g>\n", left + 8, (top + bottom) / 2);
      continue;
    }
    if (xmax == xmin) xmax = xmin + 1;  // one point: centre-less but visible
    if (ymax == ymin) {
      ymin -= 0.5;
      ymax += 0.5;
    }
    auto px = [&](double x) { return left + (x - xmin) / (xmax - xmin) * (right - left); };
    auto py = [&](double y) { return bottom - (y - ymin) / (ymax - ymin) * (bottom - top); };
    svg += fmt::format("<text x=\"{:g}\" y=\"{:g}\" text-anchor=\"end\">{}</text>\n", left - 4, top + 10,
                       detail::number_label(ymax));
    svg += fmt::format("<text x=\"{:g}\" y=\"{:g}\" text-anchor=\"end\">{}</text>\n", left - 4, bottom,
                       detail::number_label(ymin));
    svg += fmt::format("<text x=\"{:g}\" y=\"{:g}\">{}</text>\n", left, bottom + 16, detail::number_label(xmin));
    svg += fmt::format("<text x=\"{:g}\" y=\"{:g}\" text-anchor=\"end\">step {}</text>\n", right, bottom + 16,
                       detail::number_label(xmax));
    // one polyline per run of finite points
    std::string pts;
    auto flush_line = [&] {
      if (!pts.empty()) svg += fmt::format("<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"{}\"/>\n", pts);
      pts.clear();
    };
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) {
        flush_line();
        continue;
      }
      pts += fmt::format("{}{:.2f},{:.2f}", pts.empty() ? "" : " ", px(x), py(y));
    }
    flush_line();
    svg += "</g>\n";
  }
  svg += "</svg>\n";
  return svg;
}

/// Writes svg_plot(series) to `path` atomically.
inline void write_svg_plot(const std::string& path, const std::vector<PlotSeries>& series, const PlotLayout& layout = {}) {
  const auto svg = svg_plot(series, layout);
  AtomicFile out(path);
  out.write(svg.data(), svg.size());
  out.commit();
}

}  // namespace hybridrl::io
