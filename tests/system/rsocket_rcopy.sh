#!/usr/bin/env bash
# rsocket_rcopy.sh: rdmacm-utils' rcopy (a file copy over rsockets) on
# softhca, through harness.sh on 127.0.0.1.
#
#   rsocket_rcopy.sh HARNESS LIBDIR PORT SIZE
#
# A file of SIZE random bytes goes from the client to the rcopy server
# (which never exits: the harness stops it once the client has passed).
# Passes when the client exits 0 after "done", and the received file's
# SHA-256 is the sent one's. The temporary directory goes however it ends.
set -u -o pipefail
(($# == 4)) || { echo "usage: see the header of $0" >&2; exit 2; }
harness=$1 libdir=$2 port=$3 size=$4

tmp=$(mktemp -d "${TMPDIR:-/tmp}/softhca-rcopy.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT

fail() {
  echo "rsocket_rcopy.sh: FAIL: $*"
  exit 1
}

head -c "$size" /dev/urandom >"$tmp/sent.bin" || fail "cannot make the test file"
sum=$(sha256sum <"$tmp/sent.bin" | cut -d' ' -f1)
echo "rsocket_rcopy.sh: $size bytes, sha256 $sum"
bash "$harness" --name "rsocket.rcopy.$size" --timeout 30 --ready-timeout 20 --libdir "$libdir" --port "$port" \
  --ready-regex "cm: listening on" --server-persists \
  --server "env SOFTHCA_LOG=info rcopy -p $port" \
  --client "rcopy $tmp/sent.bin 127.0.0.1:$tmp/received.bin -p $port" \
  --expect-client "transferring[.][.][.]closing[.][.][.]done" \
  --expect-client "^$size bytes in " || fail "the pair failed (above)"
[[ -f $tmp/received.bin ]] || fail "no received file: $(ls -la "$tmp")"
got=$(sha256sum <"$tmp/received.bin" | cut -d' ' -f1)
[[ $got == "$sum" ]] || fail "received sha256 $got, sent $sum"
echo "rsocket_rcopy.sh: PASS: the received file's sha256 is the sent one's"
