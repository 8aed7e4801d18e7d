set terminal svg size 960,520 dynamic font 'sans,11'
set output 'analysis-latency-throughput.svg'
set grid
set key outside below center horizontal
datafile = 'analysis-latency-throughput.dat'
set multiplot title 'Workload analysis: latency against throughput (points: concurrency levels)'
unset key
set lmargin at screen 0.10
set rmargin at screen 0.47
set bmargin at screen 0.24
set tmargin at screen 0.90
set offsets graph 0.03, graph 0.03, graph 0.06, 0
set yrange [0:*]
set xlabel 'output tokens/s'
set ylabel 'TTFT p50 (ms)'
plot datafile index 0 using 2:3 with linespoints title "mono-fp16", datafile index 1 using 2:3 with linespoints title "1p1d-fp16", datafile index 2 using 2:3 with linespoints title "1p1d-w8a8-w4a16", datafile index 3 using 2:3 with linespoints title "1p1d-fp16-w4a16", datafile index 4 using 2:3 with linespoints title "mono-w4a16", datafile index 5 using 2:3 with linespoints title "mono-w8a8-w4a16", datafile index 6 using 2:3 with linespoints title "ab-fp16-vs-w8a8-w4a16"
set lmargin at screen 0.60
set rmargin at screen 0.97
set ylabel 'TPOT p50 (ms)'
plot datafile index 0 using 2:4 with linespoints title "mono-fp16", datafile index 1 using 2:4 with linespoints title "1p1d-fp16", datafile index 2 using 2:4 with linespoints title "1p1d-w8a8-w4a16", datafile index 3 using 2:4 with linespoints title "1p1d-fp16-w4a16", datafile index 4 using 2:4 with linespoints title "mono-w4a16", datafile index 5 using 2:4 with linespoints title "mono-w8a8-w4a16", datafile index 6 using 2:4 with linespoints title "ab-fp16-vs-w8a8-w4a16"
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
plot datafile index 0 using 2:3 with linespoints title "mono-fp16", datafile index 1 using 2:3 with linespoints title "1p1d-fp16", datafile index 2 using 2:3 with linespoints title "1p1d-w8a8-w4a16", datafile index 3 using 2:3 with linespoints title "1p1d-fp16-w4a16", datafile index 4 using 2:3 with linespoints title "mono-w4a16", datafile index 5 using 2:3 with linespoints title "mono-w8a8-w4a16", datafile index 6 using 2:3 with linespoints title "ab-fp16-vs-w8a8-w4a16"
unset multiplot
