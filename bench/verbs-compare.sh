#!/usr/bin/env bash
# verbs-compare.sh: the stack's own cost on one RDMA device, side by side in one run.
#
# rdma-core's ibv_rc_pingpong (polling, and -e for completion events), then twosided's bench
# on the verbs provider over the same libibverbs: rdma_twosided (event mode, and with
# --busy-poll), and the verbs floors (floor-verbs, floor-verbs-spin: one QP on ibv, no
# engine). Half of ibv_rc_pingpong's µs/iter is its one-way time; rdma_twosided's one-way
# p50 over it is what the engine, reactor and cgo add.
#
# Environment: LIB, a directory holding the libibverbs.so.1 to use (default: the project's
# userspace one, build/softverbs; empty: the system's); DEV, the device (default: the first
# of ibv_devices); GID, ibv_rc_pingpong's -g (default 3: softverbs' RoCE v2 IPv4 entry; on a
# NIC, the index `twosided devices` shows); N, iterations (default 2000); S, message bytes
# (default 64); JSON, a file for the bench's figures.
set -euo pipefail
cd "$(dirname "$0")/.."
LIB=${LIB-build/softverbs}
N=${N:-2000}
S=${S:-64}
GID=${GID:-3}
GO=${GO:-go}
if [ -n "$LIB" ]; then
	export LD_LIBRARY_PATH="$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
command -v ibv_rc_pingpong >/dev/null || { echo "verbs-compare: ibv_rc_pingpong not found (Debian: apt-get install ibverbs-utils)" >&2; exit 2; }
DEV=${DEV:-$(ibv_devices | awk 'NR > 2 { print $1; exit }')}
[ -n "$DEV" ] || { echo "verbs-compare: no RDMA device (ibv_devices lists none)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# pingpong ARGS...: one ibv_rc_pingpong pair on localhost; prints its usec/iter.
pingpong() {
	local port=$((20000 + RANDOM % 20000))
	timeout 120 ibv_rc_pingpong -d "$DEV" -g "$GID" -n "$N" -s "$S" -p "$port" "$@" >"$work/srv" 2>&1 &
	local srv=$! try
	for try in $(seq 1 40); do
		if timeout 120 ibv_rc_pingpong -d "$DEV" -g "$GID" -n "$N" -s "$S" -p "$port" "$@" 127.0.0.1 >"$work/cli" 2>&1; then
			break
		fi
		grep -q "Couldn't connect" "$work/cli" || break
		sleep 0.25
	done
	wait "$srv" || true
	grep -o '[0-9.]* usec/iter' "$work/cli" | awk '{ print $1 }'
}

poll=$(pingpong)
events=$(pingpong -e)
echo "ibv_rc_pingpong -d $DEV -s $S -n $N: polling $poll µs/iter (one-way $(awk -v x="$poll" 'BEGIN { printf "%.1f", x / 2 }') µs), -e $events µs/iter (one-way $(awk -v x="$events" 'BEGIN { printf "%.1f", x / 2 }') µs)"

"$GO" build -tags rdma -o "$work/twosided" ./cmd/twosided
common=(--provider verbs --scenario latency,burst -n "$N" -s "$S" --window 256)
echo "== events"
"$work/twosided" bench "${common[@]}" --transport rdma_twosided,floor-verbs ${JSON:+--json "$JSON.events.json"}
echo "== polling (rdma_twosided --busy-poll 50us against floor-verbs-spin)"
"$work/twosided" bench "${common[@]}" --busy-poll 50us --transport rdma_twosided,floor-verbs-spin ${JSON:+--json "$JSON.poll.json"}
