#!/usr/bin/env bash
# The peer comparison: public systems that answer the same question as neardup's index
# ("which stored 64-bit fingerprints are within Hamming distance 3 of this query?") and
# neardup itself, on one generated workload, in one run, every answer checked against brute
# force.
#
#   bench/peers/run.sh WORKDIR [N] [Q] [SEED]        # defaults: 10M stored, 100k queries
#
# Writes WORKDIR/w_stored.u64 and WORKDIR/w_queries.u64 (raw little-endian u64; gen.py), the
# brute-force truth WORKDIR/truth.bin, and for each system a (u32 query, u32 id) pairs file
# that check.py compares with the truth. Prints figures; judges nothing. Needs python3 with
# venv, gcc and cargo; installs numpy and faiss-cpu from PyPI into WORKDIR/venv.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=${1:?usage: run.sh WORKDIR [N] [Q] [SEED]}
n=${2:-10000000} q=${3:-100000} seed=${4:-20070508}
mkdir -p "$work"
cd "$work"
[[ -x venv/bin/python ]] || { python3 -m venv venv && venv/bin/pip -q install numpy faiss-cpu; }
[[ -f w_stored.u64 ]] || venv/bin/python "$here/gen.py" "$n" "$q" "$seed" w_
gcc -O3 -march=native -fopenmp -o bf "$here/bf.c"
echo "== brute force (2 threads, tiled): ground truth"
./bf blocked w_stored.u64 w_queries.u64 0 "$q" truth.bin 2
echo "== brute force, one query at a time, first 1000 queries"
./bf scalar w_stored.u64 w_queries.u64 0 1000 bf_scalar.bin
venv/bin/python "$here/check.py" truth.bin bf_scalar.bin 1000
for cfg in "multihash 2,32,1" "multihash 4,16,0"; do
  set -- $cfg
  echo "== faiss $1 $2"
  /usr/bin/time -f 'peak_rss_kb=%M' venv/bin/python "$here/bench_faiss.py" w_ "$1" "$2" "$q" 10000 "faiss_$1_${2//,/_}.bin"
  venv/bin/python "$here/check.py" truth.bin "faiss_$1_${2//,/_}.bin" "$q"
done
echo "== mih-rs (multi-index hashing), auto blocks"
cargo build -q --release --manifest-path "$here/mih/Cargo.toml" --target-dir "$work/mih-target"
/usr/bin/time -f 'peak_rss_kb=%M' "$work/mih-target/release/mih-peer" w_stored.u64 w_queries.u64 0 mih.bin
venv/bin/python "$here/check.py" truth.bin mih.bin "$q"
cargo build -q --release --manifest-path "$root/Cargo.toml" -p neardup-bench
for cfg in "lean:--design paper-4 --codec gap --block-bytes 512" "packed:--design paper-10 --layout packed"; do
  name=${cfg%%:*} opts=${cfg#*:}
  echo "== neardup $name ($opts)"
  # shellcheck disable=SC2086
  "$root/target/release/neardup-bench" index --stored w_stored.u64 --queries-file w_queries.u64 \
    --k 3 $opts --pairs "neardup_$name.bin" > "neardup_$name.txt"
  tail -n 1 "neardup_$name.txt"
  venv/bin/python "$here/check.py" truth.bin "neardup_$name.bin" "$q"
done
