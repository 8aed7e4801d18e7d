set terminal svg size 820,560 dynamic font 'sans,11'
set output '1p1d-w8a8-w4a16-stability.svg'
set grid
set key outside below center horizontal
datafile = '1p1d-w8a8-w4a16-stability.dat'
set multiplot title 'Resident memory and free KV blocks after each low phase'
unset key
set lmargin at screen 0.10
set rmargin at screen 0.95
set bmargin at screen 0.60
set tmargin at screen 0.91
set ylabel 'resident MiB'
set yrange [0:*]
set offsets 0, 0, graph 0.15, 0
set format x ''
plot datafile index 0 using 1:2 with linespoints lt 1 title "decode-1", datafile index 2 using 1:2 with linespoints lt 2 title "prefill-0"
set bmargin at screen 0.20
set tmargin at screen 0.51
set xlabel 'cycle'
set format x '%g'
set ylabel 'KV blocks free (fraction)'
set yrange [0:1.05]
plot datafile index 1 using 1:2 with linespoints lt 1 notitle, datafile index 3 using 1:2 with linespoints lt 2 notitle
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
plot datafile index 0 using 1:2 with linespoints lt 1 title "decode-1", datafile index 2 using 1:2 with linespoints lt 2 title "prefill-0"
unset multiplot
