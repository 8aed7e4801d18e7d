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
  // Writes NAME.dat and NAME.gp and draws NAME.svg (`width` x `height`
  // pixels); returns the markdown image, or a note when gnuplot is missing
  // or failed. The script runs in the plots folder with `datafile` set to
  // NAME.dat, a grid, and the key below the plot (so a long legend takes
  // height, not the data's width).
  std::string Draw(const std::string& name, const std::string& data, const std::string& script,
                   const std::string& caption, int width = 820, int height = 460);

 private:
  std::string dir_;
  bool have_gnuplot_ = false;
};

// Scripts for figures of two panels under one `title`, with one legend
// below both: `first` and `second` are gnuplot commands, each ending in a
// plot command; the legend is the first panel's (give both panels' curves
// the same titles and order, or no titles in the second). Side by side:
std::string SideBySide(const std::string& title, const std::string& first,
                       const std::string& second);
// One above the other, sharing the x axis's meaning:
std::string Stacked(const std::string& title, const std::string& first, const std::string& second);

}  // namespace pdq::report
