#!/bin/bash
# The pacer policy with a 4x straggler, without DSSP's slack (r_max 0, s_L 0:
# every read is fresh, as in BSP), same seeds as the default runs.
cd /work/main
mkdir -p /tmp/bt
for seed in 1 2 3 4 5; do
    d=/tmp/bt/noslack-$seed; rm -rf $d
    deploy/local-cluster.sh --quiet --keep-training --out $d --time-cap 15 --policy pacer \
      --worker-args-2 "--slowdown 4" --monitor-args "--seed=$seed --eval-every-clocks=100 --staleness=0 --staleness-range=0" > $d.txt 2>&1
    st=$(sed -n 's/.*clock \([0-9]*\) (every [0-9]* clocks): test accuracy \([0-9.]*\),.*/\1 \2/p' $d/monitor.log | awk '$2 >= 0.85 { print $1; exit }')
    stale=$(grep -h "final:" $d/shard0.log | sed 's/.*stale \([0-9]*\).*/\1/')
    echo "seed $seed noslack steps $st stale $stale"
done
