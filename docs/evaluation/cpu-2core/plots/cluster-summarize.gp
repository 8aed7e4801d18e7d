set terminal svg size 820,460 dynamic font 'sans,11'
set output 'cluster-summarize.svg'
set grid
set key outside below center horizontal
datafile = 'cluster-summarize.dat'
set title 'Projected: summarize output tokens/s per core within the targets, by P:D split'
set xlabel 'prefill : decode nodes (all M: every node monolithic, not joined)'
set ylabel 'tokens/s per core'
set yrange [0:*]
set offsets graph 0.03, graph 0.03, graph 0.06, 0
set xtics ("all M" 0.0000, "1:7" 0.1250, "1:3" 0.2500, "3:5" 0.3750, "1:1" 0.5000, "5:3" 0.6250, "3:1" 0.7500, "7:1" 0.8750)
plot datafile index 0 using 1:2 with linespoints linecolor 1 dashtype 1 pointtype 5 title "fp16/fp16, 8 nodes", datafile index 1 using 1:2 with linespoints linecolor 1 dashtype 2 pointtype 6 title "fp16/fp16, 32 nodes", datafile index 2 using 1:2 with linespoints linecolor 1 dashtype 3 pointtype 7 title "fp16/fp16, 128 nodes", datafile index 3 using 1:2 with linespoints linecolor 2 dashtype 1 pointtype 5 title "fp16/w4a16, 8 nodes", datafile index 4 using 1:2 with linespoints linecolor 2 dashtype 2 pointtype 6 title "fp16/w4a16, 32 nodes", datafile index 5 using 1:2 with linespoints linecolor 2 dashtype 3 pointtype 7 title "fp16/w4a16, 128 nodes", datafile index 6 using 1:2 with linespoints linecolor 3 dashtype 1 pointtype 5 title "w8a8/w4a16, 8 nodes", datafile index 7 using 1:2 with linespoints linecolor 3 dashtype 2 pointtype 6 title "w8a8/w4a16, 32 nodes", datafile index 8 using 1:2 with linespoints linecolor 3 dashtype 3 pointtype 7 title "w8a8/w4a16, 128 nodes"
