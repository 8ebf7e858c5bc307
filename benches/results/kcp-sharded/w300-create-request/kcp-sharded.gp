set terminal pngcairo size 1500,520
set output 'kcp-sharded.png'
set multiplot layout 1,3
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set key below
set grid ytics
set yrange [0:*]
set title 'what quota costs on each shard: goroutines'
plot 'kcp-sharded.dat' u ($2-$3):xtic(1) t 'kcp quota controller (1-2)', '' u 8 t 'lazyquota tasks', '' u ($4-$3) t 'kcp serving lazyquota (3-2)'
set title 'heap MiB (Go live heap / jemalloc allocated)'
plot 'kcp-sharded.dat' u ($5-$6):xtic(1) t 'kcp quota controller (1-2)', '' u 9 t 'lazyquota', '' u ($7-$6) t 'kcp serving lazyquota (3-2)'
set title 'quota create -> status.used, ms'
plot 'kcp-sharded.dat' u 10:xtic(1) t 'kcp p50', '' u 11 t 'kcp p99', '' u 12 t 'lazyquota p50', '' u 13 t 'lazyquota p99'
unset multiplot
