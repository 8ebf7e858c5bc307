set terminal pngcairo size 1500,450
set output 'kcp.png'
set multiplot layout 1,3
set key top left
set grid
set xlabel 'B (APIBindings)'
set title 'goroutines (kcp) / tokio tasks (lazyquota)'
plot 'kcp.dat' index 0 u 1:($2-$3) w lp t 'kcp quota controller (1-2)', '' index 0 u 1:12 w lp t 'lazyquota tasks', '' index 0 u 1:($4-$3) w lp t 'kcp serving lazyquota (3-2)'
set title 'heap MiB (Go live heap / jemalloc allocated)'
plot 'kcp.dat' index 0 u 1:($5-$6) w lp t 'kcp quota controller (1-2)', '' index 0 u 1:13 w lp t 'lazyquota', '' index 0 u 1:($7-$6) w lp t 'kcp serving lazyquota (3-2)'
set title 'lazyquota at the largest B'
set xlabel 'quota''d (engaged) workspaces'
plot 'kcp.dat' index 1 u 1:2 w lp t 'lazyquota tasks', '' index 1 u 1:6 w lp t 'TCP connections', '' index 1 u 1:7 w lp t 'kcp WATCHes (3-2)'
unset multiplot
