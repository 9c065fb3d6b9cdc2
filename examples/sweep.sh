#!/bin/sh
# Writes a parameter-sweep task file: examples/sweep.sh 1000 > sweep.txt; htc run sweep.txt
n=${1:-1000}
echo "#HTC timeout=5m retries=1 runtime=100ms"
i=1
while [ "$i" -le "$n" ]; do
  echo "awk 'BEGIN { s = 0; for (k = 1; k <= 20000; k++) s += sin(k * $i); printf \"%d %.6f\\n\", $i, s }'"
  i=$((i + 1))
done
