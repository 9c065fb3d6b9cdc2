#!/usr/bin/env bash
# The cluster harness itself: 1-node, 4-node loopback and 4-node netns clusters come up and run jobs.
exec "$(dirname -- "${BASH_SOURCE[0]}")/../cluster/smoke.sh" "$@"
