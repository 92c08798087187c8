#!/usr/bin/env bash
# Runs the two roles as separate processes on one machine: a shard node (internal API) and
# a router (public API) in front of it. What `neardup serve` does in one process.
#   deploy/run-split.sh [DATA_DIR]
set -euo pipefail
bin=${NEARDUP:-neardup}
data=${1:-./neardup-data}
"$bin" shard --data "$data" --listen 127.0.0.1:50061 --metrics-listen 127.0.0.1:9465 &
shard=$!
trap 'kill -TERM "$shard" 2>/dev/null; wait "$shard"' EXIT
"$bin" router --shard http://127.0.0.1:50061 --listen 127.0.0.1:50051 --metrics-listen 127.0.0.1:9464
