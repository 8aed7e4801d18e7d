set terminal svg size 820,440 dynamic font 'sans,11'
set output 'docs/evaluation/cpu-2core/plots/accuracy-bars.svg'
set grid
set key outside right
datafile = 'docs/evaluation/cpu-2core/plots/accuracy-bars.dat'
set style fill solid 0.6
set boxwidth 0.6
set xtics rotate by -30
set multiplot layout 1,2 title 'Perplexity and KL divergence against FP16'
set ylabel 'perplexity'
plot datafile using 0:2:xtic(1) with boxes notitle
set ylabel 'KL mean (nats)'
plot datafile using 0:3:xtic(1) with boxes notitle
unset multiplot
