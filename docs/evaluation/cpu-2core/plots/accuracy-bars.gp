set terminal svg size 960,480 dynamic font 'sans,11'
set output 'accuracy-bars.svg'
set grid
set key outside below center horizontal
datafile = 'accuracy-bars.dat'
set style data histogram
set style histogram clustered gap 1
set style fill solid 0.75 border -1
set datafile missing '?'
set xzeroaxis lt -1
set grid noxtics
set multiplot title 'Change against FP16, by text and precision pair (prefill / decode)'
unset key
set lmargin at screen 0.10
set rmargin at screen 0.47
set bmargin at screen 0.24
set tmargin at screen 0.90
set ylabel 'perplexity change (%)'
plot datafile using 2:xtic(1) title "w8a8 / w4a16", '' using 3 title "fp16 / w4a16", '' using 4 title "w4a16 / w4a16"
set lmargin at screen 0.60
set rmargin at screen 0.97
set ylabel 'KL mean (nats, log scale)'
set logscale y
set format y '%.0e'
plot datafile using 5:xtic(1) notitle, '' using 6 notitle, '' using 7 notitle
set lmargin at screen 0.02
set rmargin at screen 0.98
set bmargin at screen 0.01
set tmargin at screen 0.12
unset border
unset tics
unset xlabel
unset ylabel
unset grid
unset logscale
unset xzeroaxis
set xrange [-2:-1]
set yrange [-2:-1]
set key center center horizontal
plot datafile using 2:xtic(1) title "w8a8 / w4a16", '' using 3 title "fp16 / w4a16", '' using 4 title "w4a16 / w4a16"
unset multiplot
