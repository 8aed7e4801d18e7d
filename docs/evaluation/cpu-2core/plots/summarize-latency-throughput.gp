set terminal svg size 820,440 dynamic font 'sans,11'
set output 'docs/evaluation/cpu-2core/plots/summarize-latency-throughput.svg'
set grid
set key outside right
datafile = 'docs/evaluation/cpu-2core/plots/summarize-latency-throughput.dat'
set multiplot layout 1,2 title 'Workload summarize: latency against throughput (points: concurrency levels)'
set xlabel 'output tokens/s'
set ylabel 'TTFT p50 (ms)'
set key top left
plot datafile index 0 using 2:3 with linespoints title "mono-fp16", datafile index 1 using 2:3 with linespoints title "1p1d-fp16", datafile index 2 using 2:3 with linespoints title "1p1d-w8a8-w4a16", datafile index 3 using 2:3 with linespoints title "1p1d-fp16-w4a16", datafile index 4 using 2:3 with linespoints title "mono-w4a16", datafile index 5 using 2:3 with linespoints title "mono-w8a8-w4a16", datafile index 6 using 2:3 with linespoints title "ab-fp16-vs-w8a8-w4a16"
set ylabel 'TPOT p50 (ms)'
plot datafile index 0 using 2:4 with linespoints title "mono-fp16", datafile index 1 using 2:4 with linespoints title "1p1d-fp16", datafile index 2 using 2:4 with linespoints title "1p1d-w8a8-w4a16", datafile index 3 using 2:4 with linespoints title "1p1d-fp16-w4a16", datafile index 4 using 2:4 with linespoints title "mono-w4a16", datafile index 5 using 2:4 with linespoints title "mono-w8a8-w4a16", datafile index 6 using 2:4 with linespoints title "ab-fp16-vs-w8a8-w4a16"
unset multiplot
