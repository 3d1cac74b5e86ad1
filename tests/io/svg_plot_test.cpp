// io/svg_plot.hpp: panel placement and point coordinates worked out by hand from the layout
// (420 × 260 panels, margin 48), gaps at non-finite values, escaping, the empty panel, and the
// atomic write.

#include <hybridrl/io/svg_plot.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <unistd.h>

#include "../support/doctest.hpp"

namespace hybridrl::testing {
inline int count_of(const std::string& s, const std::string& what) {
  int n = 0;
  for (auto p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}
}  // namespace hybridrl::testing

TEST_SUITE("io/svg_plot") {
  TEST_CASE("points land where the layout puts them; a non-finite value breaks the line") {
    using hybridrl::io::PlotSeries;
    const std::vector<PlotSeries> s{{"reward_mean", {{0, 0}, {1, 0.5}, {2, 1.0}}},
                                    {"kl", {{0, 1}, {1, std::nan("")}, {2, 3}, {3, 2}}},
                                    {"a<b", {}}};
    const auto svg = hybridrl::io::svg_plot(s);
    // panel 0: x in [48, 396], y in [212, 24]; panel 1 starts at x = 420
    CHECK(svg.find("points=\"48.00,212.00 222.00,118.00 396.00,24.00\"") != std::string::npos);
    CHECK(svg.find("points=\"468.00,212.00\"") != std::string::npos);
    CHECK(svg.find("points=\"700.00,24.00 816.00,118.00\"") != std::string::npos);
    CHECK(hybridrl::testing::count_of(svg, "<polyline") == 3);
    CHECK(hybridrl::testing::count_of(svg, "<g class=\"panel\">") == 3);
    CHECK(svg.find("width=\"840\" height=\"520\"") != std::string::npos);  // 2 columns, 2 rows
    CHECK(svg.find(">a&lt;b<") != std::string::npos);
    CHECK(svg.find("no data") != std::string::npos);
    CHECK(svg.rfind("</svg>\n") == svg.size() - 7);
  }

  TEST_CASE("write_svg_plot writes the document atomically") {
    const auto path = std::filesystem::temp_directory_path() / ("hybridrl_plot_" + std::to_string(getpid()) + ".svg");
    const std::vector<hybridrl::io::PlotSeries> s{{"entropy", {{1, 2.0}, {2, 1.5}}}};
    hybridrl::io::write_svg_plot(path.string(), s);
    std::ifstream in(path);
    const std::string got{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    CHECK(got == hybridrl::io::svg_plot(s));
    std::filesystem::remove(path);
  }
}
