set terminal svg size 820,460 dynamic font 'sans,11'
set output 'conversation-kl-by-turn.svg'
set grid
set key outside below center horizontal
datafile = 'conversation-kl-by-turn.dat'
set title 'KL against FP16 by conversation turn'
set xlabel 'turn'
set ylabel 'KL mean (nats, log scale)'
set logscale y
set format y '%.0e'
plot datafile index 1 using 1:2 with linespoints dashtype 2 title "fp16 / fp16, KV reused", datafile index 2 using 1:2 with linespoints title "w8a8 / w4a16", datafile index 3 using 1:2 with linespoints dashtype 2 title "w8a8 / w4a16, KV reused", datafile index 4 using 1:2 with linespoints dashtype 3 title "w8a8 / w4a16, KV reused, follow-ups at w4a16", datafile index 5 using 1:2 with linespoints title "fp16 / w4a16", datafile index 6 using 1:2 with linespoints dashtype 2 title "fp16 / w4a16, KV reused", datafile index 7 using 1:2 with linespoints dashtype 3 title "fp16 / w4a16, KV reused, follow-ups at w4a16", datafile index 8 using 1:2 with linespoints title "w4a16 / w4a16", datafile index 9 using 1:2 with linespoints dashtype 2 title "w4a16 / w4a16, KV reused"
