#!/usr/bin/env bash
# targets.sh: the stack's own cost against its references, in one run, R alternating rounds.
#
# Each round runs, two processes, 64 B: latency in event mode (oob, floor-block and UCX's
# ucp_am_lat over TCP; the oob round trip is a notify and the receiver's echo, and
# floor-echo moves that echo's four frames over raw sockets), the same
# with --no-echo (a round trip is one notify and its ACK, as floor-block's is one message
# and its ack: the like-for-like CPU per notify; beside them floor-epoll, the same exchange
# waited for as the reactor waits, with no engine; floor-loop, on the reactor itself;
# floor-node, as OOB frames through an oob.Node on it; and floor-uring, waited for through
# io_uring), latency with --busy-poll 50us (oob,
# floor-spin), a pipelined burst (window 256, 1 s, oob and UCX's ucp_am_bw) and, when the
# verbs provider builds and softverbs is there (make softverbs), rdma_twosided against
# floor-verbs on it, with the echo (and floor-verbs-echo, the echo's SENDs on the device) and
# with --no-echo. Then bench/targets prints every
# target's figure per round, the median and whether it is met (exit status 1 when one is
# not).
#
# Environment: R, rounds (default 3); OUT, a directory for the binaries and the JSON of
# every run (default build/targets); N, notifies per latency run in event mode (default
# 60000: every phase runs at least 1 s on the machines measured so far); N_BUSY, notifies
# per busy-poll run (default 200000: a busy-polled round trip takes 10-20 us here, so 60000
# would end a phase in under a second).
set -euo pipefail
cd "$(dirname "$0")/.."
R=${R:-3}
N=${N:-60000}
N_BUSY=${N_BUSY:-200000}
OUT=${OUT:-build/targets}
GO=${GO:-go}
mkdir -p "$OUT"
rm -f "$OUT"/round-*.json
"$GO" build -o "$OUT/twosided" ./cmd/twosided
rdma=
if [ -f build/softverbs/libibverbs.so.1 ] && "$GO" build -tags rdma -o "$OUT/twosided-rdma" ./cmd/twosided 2>/dev/null; then
	rdma=1
else
	echo "targets: no softverbs build (make softverbs) or no -tags rdma build: the rdma_twosided rows are left out"
fi
bin=$OUT/twosided
for r in $(seq 1 "$R"); do
	echo "== round $r of $R ($(date +%T), load $(cut -d' ' -f1 /proc/loadavg))"
	"$bin" bench --scenario latency --transport oob,floor-block,floor-echo -s 64 -n "$N" --keepalive-off --anchors ucx --json "$OUT/round-$r-ev.json"
	"$bin" bench --scenario latency --transport oob,floor-block,floor-epoll,floor-loop,floor-node,floor-uring -s 64 -n "$N" --keepalive-off --no-echo --json "$OUT/round-$r-ack.json"
	"$bin" bench --scenario latency --transport oob,floor-spin -s 64 -n "$N_BUSY" --keepalive-off --busy-poll 50us --json "$OUT/round-$r-busy.json"
	"$bin" bench --scenario burst --transport oob -s 64 --window 256 --repeat 1 --burst-time 1s --keepalive-off --anchors ucx --json "$OUT/round-$r-burst.json"
	if [ -n "$rdma" ]; then
		LD_LIBRARY_PATH="$PWD/build/softverbs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$OUT/twosided-rdma" bench --provider verbs \
			--scenario latency --transport rdma_twosided,floor-verbs,floor-verbs-echo -s 64 -n "$N" --keepalive-off --json "$OUT/round-$r-rdma.json"
		LD_LIBRARY_PATH="$PWD/build/softverbs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$OUT/twosided-rdma" bench --provider verbs \
			--scenario latency --transport rdma_twosided,floor-verbs -s 64 -n "$N" --keepalive-off --no-echo --json "$OUT/round-$r-rdma-ack.json"
	fi
done
echo "== targets (median of $R rounds; each round's figure is ours over its reference of the same round)"
"$GO" run ./bench/targets "$OUT"
