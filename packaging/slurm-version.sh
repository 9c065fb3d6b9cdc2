#!/bin/sh
# Prints the version of the Slurm headers the plugin is built against, e.g. 22.05.8, from
# slurm_version.h: SLURM_VERSION_STRING where the header has it, else decoded from
# SLURM_VERSION_NUMBER (Debian's header has only the number).
#
#   slurm-version.sh [INCLUDE_DIR]      default: $SLURM_INCLUDE_DIR, else /usr/include
set -eu
h=${1:-${SLURM_INCLUDE_DIR:-/usr/include}}/slurm/slurm_version.h
[ -r "$h" ] || { echo "slurm-version.sh: $h not found (install libslurm-dev / slurm-devel)" >&2; exit 1; }
awk '
    $1 == "#define" && $2 == "SLURM_VERSION_STRING" { gsub(/"/, "", $3); s = $3 }
    $1 == "#define" && $2 == "SLURM_VERSION_NUMBER" { n = $3 }
    END {
        if (s == "" && n ~ /^0x[0-9a-fA-F]+$/) {
            v = 0
            for (i = 3; i <= length(n); i++) v = v * 16 + index("0123456789abcdef", tolower(substr(n, i, 1))) - 1
            s = sprintf("%d.%02d.%d", int(v / 65536) % 256, int(v / 256) % 256, v % 256)
        }
        if (s == "") exit 1
        print s
    }' "$h" || { echo "slurm-version.sh: no Slurm version in $h" >&2; exit 1; }
