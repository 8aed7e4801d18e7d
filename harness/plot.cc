#include "harness/plot.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace pdq::report {

namespace fs = std::filesystem;

Plotter::Plotter(std::string dir) : dir_(std::move(dir)) {
  fs::create_directories(dir_);
  have_gnuplot_ = std::system("command -v gnuplot >/dev/null 2>&1") == 0;
}

std::string Plotter::Draw(const std::string& name, const std::string& data,
                          const std::string& script, const std::string& caption, int width,
                          int height) {
  const std::string base = dir_ + "/" + name;
  std::ofstream(base + ".dat") << data;
  // Paths relative to the plots folder, so a committed script redraws anywhere.
  std::ofstream(base + ".gp") << "set terminal svg size " << width << "," << height
                              << " dynamic font 'sans,11'\n"
                              << "set output '" << name << ".svg'\n"
                              << "set grid\nset key outside below center horizontal\n"
                              << "datafile = '" << name << ".dat'\n"
                              << script;
  if (!have_gnuplot_)
    return absl::StrCat("*(", caption, ": gnuplot is not installed; data in plots/", name,
                        ".dat)*\n");
  const std::string cmd =
      absl::StrCat("cd '", dir_, "' && gnuplot '", name, ".gp' 2>'", name, ".err'");
  if (std::system(cmd.c_str()) != 0) {
    return absl::StrCat("*(", caption, ": gnuplot failed, see plots/", name, ".err)*\n");
  }
  fs::remove(base + ".err");
  return absl::StrCat("![", caption, "](plots/", name, ".svg)\n");
}

namespace {

// Two panels at fixed places on the canvas (`*_box`: margins as fractions
// of it), then the legend across the bottom: a third panel without axes that
// replays the first panel's plot command with every point out of range, so
// only the key is drawn. (A key of one panel is as wide as that panel, and
// an outside key squeezes it: both are what made the old figures unreadable.)
std::string Panels(const std::string& title, const std::string& first, const char* first_box,
                   const std::string& second, const char* second_box) {
  const size_t at = first.rfind("plot ");
  PDQ_CHECK(at != std::string::npos && (at == 0 || first[at - 1] == '\n'));
  const std::string first_plot = first.substr(at);
  return absl::StrCat("set multiplot title '", title, "'\nunset key\n", first_box, first, "\n",
                      second_box, second, "\n",
                      "set lmargin at screen 0.02\nset rmargin at screen 0.98\n"
                      "set bmargin at screen 0.01\nset tmargin at screen 0.12\n"
                      "unset border\nunset tics\nunset xlabel\nunset ylabel\nunset grid\n"
                      "unset logscale\nunset xzeroaxis\nset xrange [-2:-1]\nset yrange [-2:-1]\n"
                      "set key center center horizontal\n",
                      first_plot, "\nunset multiplot\n");
}

}  // namespace

// Where the two panels go (margins as fractions of the canvas).
// The left margins hold six-digit tick labels (TTFT in ms) and the axis label.
constexpr const char* kSideBySide[2] = {
    "set lmargin at screen 0.10\nset rmargin at screen 0.47\n"
    "set bmargin at screen 0.24\nset tmargin at screen 0.90\n",
    "set lmargin at screen 0.60\nset rmargin at screen 0.97\n"};
constexpr const char* kStacked[2] = {
    "set lmargin at screen 0.10\nset rmargin at screen 0.95\n"
    "set bmargin at screen 0.60\nset tmargin at screen 0.91\n",
    "set bmargin at screen 0.20\nset tmargin at screen 0.51\n"};

std::string SideBySide(const std::string& title, const std::string& first,
                       const std::string& second) {
  return Panels(title, first, kSideBySide[0], second, kSideBySide[1]);
}

std::string Stacked(const std::string& title, const std::string& first, const std::string& second) {
  return Panels(title, first, kStacked[0], second, kStacked[1]);
}

}  // namespace pdq::report
