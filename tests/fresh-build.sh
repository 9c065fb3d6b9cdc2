#!/usr/bin/env bash
# A newcomer's first minute: in a clean copy of the source, with nothing but Rust (no protoc, no
# libclang, no Slurm headers reachable), the README's main command builds and runs the example.
#
#   tests/fresh-build.sh
#
# A checkout that is already clean (a fresh clone, as CI's: nothing untracked, modified or ignored
# but target/, and no release build yet) is built where it is, into its own target/: that build
# is as fresh as one in a copy, and the release build of the tiers after this one then reuses it
# instead of compiling everything a second time. Any other checkout is copied first.
set -euo pipefail
root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
tmp=$(mktemp -d /tmp/htc-fresh.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

pristine() {
    [[ ! -e $root/target/release ]] || return 1
    local s
    s=$(cd "$root" && git status --porcelain --ignored) || return 1
    [[ -z $(grep -vx '!! target/' <<<"$s") ]]
}
if pristine; then
    src=$root target=$root/target
    echo "the checkout is clean and has no release build: building it in place"
else
    # The working tree as git would clone it (tracked and new, not ignored, files), without target/.
    src=$tmp/src target=$tmp/target
    (cd "$root" && git ls-files -z -co --exclude-standard | xargs -0 tar -cf - 2>/dev/null) | (mkdir -p "$src" && cd "$src" && tar -xf -)
fi

# A PATH with the toolchain and the base system only; protoc, if this machine has one, hidden.
mkdir -p "$tmp/bin"
for tool in cargo rustc cc gcc ld ar sh bash env tar git; do
    p=$(command -v "$tool" || true)
    [[ -n $p ]] && ln -sf "$p" "$tmp/bin/$tool"
done
clean_env=(env -i HOME="$HOME" PATH="$tmp/bin:/bin:/usr/bin" CARGO_HOME="${CARGO_HOME:-$HOME/.cargo}"
    RUSTUP_HOME="${RUSTUP_HOME:-$HOME/.rustup}" PROTOC=/nonexistent/protoc LIBCLANG_PATH=/nonexistent
    CARGO_TARGET_DIR="$target")
if "${clean_env[@]}" sh -c 'command -v protoc' >/dev/null 2>&1; then
    # /usr/bin is on the clean PATH; a protoc there must not be what the build relies on.
    echo "note: this machine has $(command -v protoc); PROTOC=/nonexistent keeps the build from using it"
fi

cd "$src"
echo "+ cargo build --release && target/release/htc run examples/hello.txt   (clean env, no protoc)"
"${clean_env[@]}" cargo build --release --locked
# The run itself in a scratch directory, so that no .htc/ is left in the source.
mkdir -p "$tmp/run" && cp -r examples "$tmp/run/" && cd "$tmp/run"
out=$("${clean_env[@]}" "$target/release/htc" run examples/hello.txt 2>&1) || {
    # The example has one task that fails its first attempt and succeeds on the retry.
    echo "$out"
    echo "FAILED: htc run examples/hello.txt exited non-zero"
    exit 1
}
echo "$out" | tail -5
tasks=$(grep -cvE '^\s*(#|$)' examples/hello.txt)
"${clean_env[@]}" "$target/release/htc" status >"$tmp/status" 2>&1
grep -q "done=$tasks failed=0" "$tmp/status" || { cat "$tmp/status"; echo "FAILED: not every task is done"; exit 1; }
if [[ -e "$target/release/libspank_htc.so" ]]; then
    echo "FAILED: the default build built the plugin"
    exit 1
fi
echo "fresh build: ok ($tasks tasks done, plugin not built, no protoc used)"
