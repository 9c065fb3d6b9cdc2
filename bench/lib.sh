# Shared by bench scripts (sourced): `bench_setup NAME` makes the report file
# (OUT, default bench/results/NAME-<date>.txt) and a scratch directory (WORK, removed at exit),
# sends everything printed to the report as well, and builds the release binaries if missing.
# Needs BENCH, ROOT and HTC set.
bench_setup() {
    mkdir -p "$BENCH/results"
    OUT=${OUT:-$BENCH/results/$1-$(date +%Y%m%d-%H%M%S).txt}
    WORK=$(mktemp -d "/tmp/htc-$1.XXXXXX")
    trap 'rm -rf "$WORK"' EXIT
    exec > >(tee "$OUT") 2>&1
    [[ -x $HTC ]] || (cd "$ROOT" && cargo build --profile dist -p node-agent)
}
