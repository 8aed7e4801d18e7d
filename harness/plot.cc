#include "harness/plot.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace pdq::report {

namespace fs = std::filesystem;

Plotter::Plotter(std::string dir) : dir_(std::move(dir)) {
  fs::create_directories(dir_);
  have_gnuplot_ = std::system("command -v gnuplot >/dev/null 2>&1") == 0;
}

std::string Plotter::Draw(const std::string& name, const std::string& data,
                          const std::string& script, const std::string& caption) {
  const std::string base = dir_ + "/" + name;
  std::ofstream(base + ".dat") << data;
  std::ofstream(base + ".gp") << "set terminal svg size 820,440 dynamic font 'sans,11'\n"
                              << "set output '" << base << ".svg'\n"
                              << "set grid\nset key outside right\n"
                              << "datafile = '" << base << ".dat'\n"
                              << script;
  if (!have_gnuplot_)
    return absl::StrCat("*(", caption, ": gnuplot is not installed; data in plots/", name,
                        ".dat)*\n");
  const std::string cmd = absl::StrCat("gnuplot '", base, ".gp' 2>'", base, ".err'");
  if (std::system(cmd.c_str()) != 0) {
    return absl::StrCat("*(", caption, ": gnuplot failed, see plots/", name, ".err)*\n");
  }
  fs::remove(base + ".err");
  return absl::StrCat("![", caption, "](plots/", name, ".svg)\n");
}

}  // namespace pdq::report
