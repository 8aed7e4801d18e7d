// Plots of the evaluation report: gnuplot scripts and their data written
// beside the SVG they draw, so a reader can redraw or restyle them.
#pragma once

#include <string>

namespace pdq::report {

class Plotter {
 public:
  // Plots go to `dir` (created).
  explicit Plotter(std::string dir);
  bool available() const { return have_gnuplot_; }
  // Writes NAME.dat and NAME.gp and draws NAME.svg; returns the markdown
  // image, or a note when gnuplot is missing or failed.
  std::string Draw(const std::string& name, const std::string& data, const std::string& script,
                   const std::string& caption);

 private:
  std::string dir_;
  bool have_gnuplot_ = false;
};

}  // namespace pdq::report
