#!/bin/bash
# BSP with the full training set against BSP with 2/3 of it, same seeds.
cd /work/main
for seed in 1 2 3 4 5; do
  for lim in 0 40000; do
    d=/tmp/dt/$lim-$seed; rm -rf $d
    wa=""; [ $lim -gt 0 ] && wa="--train-limit $lim"
    deploy/local-cluster.sh --quiet --keep-training --out $d --time-cap 15 --policy fixed --mode bsp \
      --worker-args "$wa" --monitor-args "--seed=$seed --eval-every-clocks=100" > $d.txt 2>&1
    st=$(sed -n 's/.*clock \([0-9]*\) (every [0-9]* clocks): test accuracy \([0-9.]*\),.*/\1 \2/p' $d/monitor.log | awk '$2 >= 0.85 { print $1; exit }')
    echo "seed $seed limit $lim steps $st"
  done
done
