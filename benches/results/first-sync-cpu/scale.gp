set terminal pngcairo size 1200,500
set output 'scale.png'
set multiplot layout 1,2
set key top left
set xlabel 'N (namespaced CRDs)'
set grid
set title 'RSS (MiB)'
plot 'scale.dat' u 1:2 w lp t 'KCM quota controller', '' u 1:3 w lp t 'lazyquota eager', '' u 1:4 w lp t 'lazyquota lazy'
set title 'goroutines (KCM) / tokio tasks (lazyquota)'
plot 'scale.dat' u 1:5 w lp t 'KCM quota controller', '' u 1:6 w lp t 'lazyquota eager', '' u 1:7 w lp t 'lazyquota lazy'
unset multiplot
