set terminal svg size 820,460 dynamic font 'sans,11'
set output 'analysis-ttft-cdf.svg'
set grid
set key outside below center horizontal
datafile = 'analysis-ttft-cdf.dat'
set title 'Workload analysis: TTFT distribution at concurrency 16'
set xlabel 'TTFT (ms)'
set ylabel 'fraction of requests'
plot datafile index 0 using 1:2 with steps title "mono-fp16", datafile index 1 using 1:2 with steps title "1p1d-fp16", datafile index 2 using 1:2 with steps title "1p1d-w8a8-w4a16", datafile index 3 using 1:2 with steps title "1p1d-fp16-w4a16", datafile index 4 using 1:2 with steps title "mono-w4a16", datafile index 5 using 1:2 with steps title "mono-w8a8-w4a16", datafile index 6 using 1:2 with steps title "ab-fp16-vs-w8a8-w4a16"
