#!/usr/bin/env bash
# A newcomer's first minute: in a clean copy of the source, with nothing but Rust (no protoc, no
# libclang, no Slurm headers reachable), the README's main command builds and runs the example.
#
#   tests/fresh-build.sh
set -euo pipefail
root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
tmp=$(mktemp -d /tmp/htc-fresh.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# The working tree as git would clone it (tracked and new, not ignored, files), without target/.
(cd "$root" && git ls-files -z -co --exclude-standard | xargs -0 tar -cf - 2>/dev/null) | (mkdir -p "$tmp/src" && cd "$tmp/src" && tar -xf -)

# A PATH with the toolchain and the base system only; protoc, if this machine has one, hidden.
mkdir -p "$tmp/bin"
for tool in cargo rustc cc gcc ld ar sh bash env tar git; do
    p=$(command -v "$tool" || true)
    [[ -n $p ]] && ln -sf "$p" "$tmp/bin/$tool"
done
clean_env=(env -i HOME="$HOME" PATH="$tmp/bin:/bin:/usr/bin" CARGO_HOME="${CARGO_HOME:-$HOME/.cargo}"
    RUSTUP_HOME="${RUSTUP_HOME:-$HOME/.rustup}" PROTOC=/nonexistent/protoc LIBCLANG_PATH=/nonexistent
    CARGO_TARGET_DIR="$tmp/target")
if "${clean_env[@]}" sh -c 'command -v protoc' >/dev/null 2>&1; then
    # /usr/bin is on the clean PATH; a protoc there must not be what the build relies on.
    echo "note: this machine has $(command -v protoc); PROTOC=/nonexistent keeps the build from using it"
fi

cd "$tmp/src"
echo "+ cargo build --release && target/release/htc run examples/hello.txt   (clean env, no protoc)"
"${clean_env[@]}" cargo build --release --locked
out=$("${clean_env[@]}" "$tmp/target/release/htc" run examples/hello.txt 2>&1) || {
    # The example has one task that fails its first attempt and succeeds on the retry.
    echo "$out"
    echo "FAILED: htc run examples/hello.txt exited non-zero"
    exit 1
}
echo "$out" | tail -5
tasks=$(grep -cvE '^\s*(#|$)' examples/hello.txt)
"${clean_env[@]}" "$tmp/target/release/htc" status >"$tmp/status" 2>&1
grep -q "done=$tasks failed=0" "$tmp/status" || { cat "$tmp/status"; echo "FAILED: not every task is done"; exit 1; }
if [[ -e "$tmp/target/release/libspank_htc.so" ]]; then
    echo "FAILED: the default build built the plugin"
    exit 1
fi
echo "fresh build: ok ($tasks tasks done, plugin not built, no protoc used)"
