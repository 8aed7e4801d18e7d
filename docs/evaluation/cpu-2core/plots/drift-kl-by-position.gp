set terminal svg size 820,460 dynamic font 'sans,11'
set output 'drift-kl-by-position.svg'
set grid
set key outside below center horizontal
datafile = 'drift-kl-by-position.dat'
set title 'KL against FP16 by generated position (running mean of 16)'
set xlabel 'generated token'
set ylabel 'KL (nats, log scale)'
set logscale y
set format y '%.0e'
plot datafile index 1 using 1:2 with lines title "w8a8 / w4a16", datafile index 2 using 1:2 with lines title "fp16 / w4a16", datafile index 3 using 1:2 with lines title "w4a16 / w4a16"
