set terminal svg size 820,440 dynamic font 'sans,11'
set output 'docs/evaluation/cpu-2core/plots/1p1d-w8a8-w4a16-stability.svg'
set grid
set key outside right
datafile = 'docs/evaluation/cpu-2core/plots/1p1d-w8a8-w4a16-stability.dat'
set title 'Resident memory and free KV blocks after each low phase'
set xlabel 'cycle'
set ylabel 'resident MiB'
set y2label 'KV blocks free (fraction)'
set y2range [0:1.05]
set ytics nomirror
set y2tics
plot datafile index 0 using 1:2 axes x1y1 with linespoints title "decode-1 resident MiB", datafile index 2 using 1:2 axes x1y1 with linespoints title "prefill-0 resident MiB", datafile index 1 using 1:2 axes x1y2 with linespoints dt 2 title "decode-1 KV free (fraction)", datafile index 3 using 1:2 axes x1y2 with linespoints dt 2 title "prefill-0 KV free (fraction)"
