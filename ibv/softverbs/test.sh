#!/usr/bin/env bash
# softverbs checks (make softverbs-test). Runs from the repository root after the build; every
# step says PASS, FAIL or SKIPPED (with why); the script fails when any step failed.
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
lib="$root/build/softverbs"
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
GO=${GO:-go}
iters=${SOFTVERBS_ITERS:-1000}
dev=${SOFTVERBS_DEVICE:-softverbs0}
work=$(mktemp -d /tmp/softverbs-test.XXXXXX)
madenode=
trap 'rm -rf "$work"; [ -z "$madenode" ] || rm -f "$madenode"' EXIT
results=()
failed=0

step() { # step NAME STATUS [DETAIL]
	results+=("$(printf '%-8s %s%s' "$2" "$1" "${3:+: $3}")")
	[ "$2" = FAIL ] && failed=1
	echo "== $2 $1${3:+: $3}"
}

if [ ! -f "$lib/libibverbs.so.1" ]; then
	echo "test.sh: $lib/libibverbs.so.1 missing; run make softverbs first" >&2
	exit 1
fi

# 0. The symbol set: every symbol and version rdma-core's libibverbs.so.1 exports (when it is
# installed: the system's copy), and the programs and libraries linked against it load with
# every symbol bound at once (LD_BIND_NOW / RTLD_NOW): perftest (through librdmacm), every
# pyverbs module, the vendor provider libraries UCX and libfabric link.
syslib=
for d in /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib /lib/x86_64-linux-gnu; do
	if [ -f "$d/libibverbs.so.1" ]; then syslib="$d/libibverbs.so.1"; break; fi
done
if ! command -v nm >/dev/null; then
	step "symbol set equals rdma-core's" SKIPPED "nm not installed"
elif [ -z "$syslib" ]; then
	step "symbol set equals rdma-core's" SKIPPED "rdma-core's libibverbs.so.1 not installed"
else
	syms() { nm -D --with-symbol-versions --defined-only "$1" | awk '{print $2, $3}' | sort; }
	syms "$syslib" >"$work/syms.sys"
	syms "$lib/libibverbs.so.1" >"$work/syms.sv"
	if diff "$work/syms.sys" "$work/syms.sv" >"$work/syms.diff"; then
		step "symbol set equals rdma-core's ($syslib)" PASS "$(wc -l <"$work/syms.sv") symbols and versions"
	else
		echo "-- < only rdma-core's, > only softverbs':"; cat "$work/syms.diff"
		step "symbol set equals rdma-core's ($syslib)" FAIL
	fi
fi
loads=() noload=()
if command -v ib_send_lat >/dev/null; then
	if LD_BIND_NOW=1 ib_send_lat --help >"$work/load" 2>&1 || grep -q Usage "$work/load"; then
		loads+=(perftest)
	else
		cat "$work/load"; step "perftest loads (LD_BIND_NOW)" FAIL
	fi
else
	noload+=("perftest")
fi
if [ -d /usr/lib/python3/dist-packages/pyverbs ] && [ -x /usr/bin/python3 ]; then
	if LD_BIND_NOW=1 /usr/bin/python3 - >"$work/load" 2>&1 <<-'EOF'
		import glob, importlib, sys
		root = "/usr/lib/python3/dist-packages/"
		mods = sorted(p[len(root):].split(".cpython")[0].replace("/", ".")
			      for p in glob.glob(root + "pyverbs/**/*.so", recursive=True))
		bad = 0
		for m in mods:
		    try:
		        importlib.import_module(m)
		    except Exception as e:
		        print("FAIL", m, e); bad = 1
		import pyverbs.device as d
		names = [x.name.decode() for x in d.get_device_list()]
		print(len(mods), "modules;", names)
		sys.exit(bad or not names)
	EOF
	then
		loads+=("pyverbs ($(head -c 60 "$work/load"))")
	else
		cat "$work/load"; step "pyverbs imports (LD_BIND_NOW)" FAIL
	fi
else
	noload+=("pyverbs")
fi
provs=$(ls /usr/lib/x86_64-linux-gnu/libibverbs/*.so /usr/lib/x86_64-linux-gnu/libmlx5.so.1 \
	/usr/lib/x86_64-linux-gnu/libefa.so.1 /usr/lib/x86_64-linux-gnu/librdmacm.so.1 2>/dev/null)
if [ -n "$provs" ] && [ -x /usr/bin/python3 ]; then
	# RTLD_NOW (2) | RTLD_GLOBAL: every undefined symbol must resolve in softverbs.
	if /usr/bin/python3 -c '
import ctypes, sys
bad = 0
for l in sys.argv[1:]:
    try:
        ctypes.CDLL(l, mode=ctypes.RTLD_GLOBAL | 2)
    except OSError as e:
        print("FAIL", e); bad = 1
sys.exit(bad)' $provs >"$work/load" 2>&1; then
		loads+=("$(echo "$provs" | wc -l) provider libraries")
	else
		cat "$work/load"; step "provider libraries load (RTLD_NOW)" FAIL
	fi
else
	noload+=("provider libraries")
fi
if [ ${#loads[@]} -gt 0 ]; then
	step "linked programs load, every symbol bound" PASS "$(IFS=,; echo "${loads[*]}")"
fi
if [ ${#noload[@]} -gt 0 ]; then
	step "linked programs load: ${noload[*]}" SKIPPED "not installed (perftest, python3-pyverbs, ibverbs-providers)"
fi

# 1. ibv_devices and ibv_devinfo -v list the device and its GID table.
if command -v ibv_devices >/dev/null && command -v ibv_devinfo >/dev/null; then
	if ibv_devices | tee "$work/devices" | grep -q "^ *$dev "; then
		step "ibv_devices lists $dev" PASS
	else
		cat "$work/devices"; step "ibv_devices lists $dev" FAIL
	fi
	ibv_devinfo -v -d "$dev" >"$work/devinfo" 2>&1
	if grep -q "state:.*PORT_ACTIVE" "$work/devinfo" &&
		grep -q "GID\[  0\]:.*fe80.*RoCE v1" "$work/devinfo" &&
		grep -q "GID\[  1\]:.*fe80.*RoCE v2" "$work/devinfo" &&
		grep -q "GID\[  2\]:.*ffff:7f00:0001, RoCE v1" "$work/devinfo" &&
		grep -q "GID\[  3\]:.*::ffff:127.0.0.1, RoCE v2" "$work/devinfo"; then
		step "ibv_devinfo -v shows the port and GIDs 0-3" PASS
	else
		cat "$work/devinfo"; step "ibv_devinfo -v shows the port and GIDs 0-3" FAIL
	fi
else
	step "ibv_devices / ibv_devinfo" SKIPPED "ibverbs-utils not installed"
fi

# 2. ibv_rc_pingpong between two processes, polling and with completion events (RoCE: GID 3,
# the IPv4 RoCE v2 entry).
pingpong() { # pingpong NAME ARGS... (each side runs $pp -d $dev -n $iters -p PORT ARGS...)
	# $pp_tries runs (default 1), each bounded by $pp_timeout seconds (default 120): UC and UD
	# resend nothing, so one datagram the shared host's loopback drops (its backlog
	# overflowing under other traffic) stalls a run for good; another run says whether
	# softverbs or the host lost it.
	local name=$1; shift
	local prog=${pp:-ibv_rc_pingpong} tries=${pp_tries:-1} lim=${pp_timeout:-120} try ok=0 src=1
	for try in $(seq 1 "$tries"); do
		local port=$((20000 + RANDOM % 20000))
		timeout "$lim" "$prog" -d "$dev" -n "$iters" -p "$port" "$@" >"$work/srv" 2>&1 &
		local srv=$!
		ok=0
		for _ in $(seq 1 40); do
			if timeout "$lim" "$prog" -d "$dev" -n "$iters" -p "$port" "$@" 127.0.0.1 >"$work/cli" 2>&1; then
				ok=1; break
			fi
			grep -q "Couldn't connect" "$work/cli" || break
			sleep 0.25
		done
		wait "$srv"; src=$?
		if [ $ok = 1 ] && [ $src = 0 ]; then break; fi
	done
	if [ $ok = 1 ] && [ $src = 0 ]; then
		local note=""
		[ "$try" -gt 1 ] && note=" (run $try of $tries: an earlier one lost a datagram)"
		step "$prog $name" PASS "$(grep -o '[0-9.]* usec/iter' "$work/cli")$note"
	else
		echo "-- server:"; cat "$work/srv"; echo "-- client:"; cat "$work/cli"
		step "$prog $name" FAIL
	fi
}
if command -v ibv_rc_pingpong >/dev/null; then
	pingpong "-n $iters (polling)" -g 3
	pingpong "-n $iters -e (events)" -g 3 -e
	pingpong "-n $iters -N (ibv_create_qp_ex, the ibv_wr_* API)" -g 3 -N
	# 16 QPs on one shared receive queue
	pp=ibv_srq_pingpong pingpong "-n $iters (16 QPs, one SRQ)" -g 3
	pp=ibv_srq_pingpong pingpong "-n $iters -e (16 QPs, one SRQ, events)" -g 3 -e
	# UC and UD: nothing is resent, so a datagram the loaded host dropped would hang them: no
	# loss here (SOFTVERBS_DROP_PCT unset), and loopback UDP at one message in flight keeps
	# its packets
	pp=ibv_uc_pingpong pp_tries=3 pp_timeout=60 pingpong "-n $iters (UC)" -g 3
	pp=ibv_ud_pingpong pp_tries=3 pp_timeout=60 pingpong "-n $iters (UD, address handles)" -g 3
else
	step "ibv_rc_pingpong" SKIPPED "ibverbs-utils not installed"
fi

# 2b. InfiniBand mode (SOFTVERBS_LINK=ib): link layer InfiniBand, a LID, one GID (fe80::GUID,
# no RoCE entries); ibv_rc_pingpong without -g addresses its peer by LID alone (no GRH).
if command -v ibv_devinfo >/dev/null && command -v ibv_rc_pingpong >/dev/null; then
	export SOFTVERBS_LINK=ib
	ibv_devinfo -v -d "$dev" >"$work/devinfo-ib" 2>&1
	if grep -q "state:.*PORT_ACTIVE" "$work/devinfo-ib" &&
		grep -q "link_layer:.*InfiniBand" "$work/devinfo-ib" &&
		grep -Eq "port_lid:[[:space:]]*[1-9][0-9]*$" "$work/devinfo-ib" &&
		[ "$(grep -c 'GID\[' "$work/devinfo-ib")" = 1 ] &&
		grep -q "GID\[  0\]:[[:space:]]*fe80:" "$work/devinfo-ib" &&
		! grep -q "RoCE" "$work/devinfo-ib"; then
		step "SOFTVERBS_LINK=ib: ibv_devinfo -v shows InfiniBand, a LID, one GID" PASS \
			"lid $(sed -n 's/.*port_lid:[[:space:]]*//p' "$work/devinfo-ib")"
	else
		cat "$work/devinfo-ib"; step "SOFTVERBS_LINK=ib: ibv_devinfo -v shows InfiniBand, a LID, one GID" FAIL
	fi
	pingpong "-n $iters, SOFTVERBS_LINK=ib, no -g (LID only)"
	unset SOFTVERBS_LINK
else
	step "SOFTVERBS_LINK=ib: ibv_devinfo, ibv_rc_pingpong" SKIPPED "ibverbs-utils not installed"
fi

# 2c. RoCE v2 entries only (SOFTVERBS_ROCE=v2): GID 0 fe80:: and GID 1 IPv4, both RoCE v2, as
# NICs that list no v1 entries; ibv_rc_pingpong over GID 1.
if command -v ibv_devinfo >/dev/null && command -v ibv_rc_pingpong >/dev/null; then
	export SOFTVERBS_ROCE=v2
	ibv_devinfo -v -d "$dev" >"$work/devinfo-v2" 2>&1
	if [ "$(grep -c 'GID\[' "$work/devinfo-v2")" = 2 ] &&
		grep -q "GID\[  0\]:[[:space:]]*fe80:.*RoCE v2" "$work/devinfo-v2" &&
		grep -q "GID\[  1\]:[[:space:]]*::ffff:.*RoCE v2" "$work/devinfo-v2"; then
		step "SOFTVERBS_ROCE=v2: ibv_devinfo -v shows GID 0 fe80:: and GID 1 IPv4, RoCE v2" PASS
	else
		cat "$work/devinfo-v2"; step "SOFTVERBS_ROCE=v2: ibv_devinfo -v shows GID 0 fe80:: and GID 1 IPv4, RoCE v2" FAIL
	fi
	pingpong "-n $iters, SOFTVERBS_ROCE=v2, GID 1" -g 1
	unset SOFTVERBS_ROCE
else
	step "SOFTVERBS_ROCE=v2: ibv_devinfo, ibv_rc_pingpong" SKIPPED "ibverbs-utils not installed"
fi

# 2c. perftest's seven programs between two processes (RoCE v2 over GID 3), 64 B and 64 KiB
# (ib_atomic_lat: 8 B, FETCH_AND_ADD and CMP_AND_SWAP); the figures are printed, never judged.
perf() { # perf NAME ARGS... (server: NAME ARGS -p PORT; client: the same and 127.0.0.1)
	local name="$*" ok=0 src=1
	for _ in 1 2 3 4 5; do
		local port=$((20000 + RANDOM % 20000))
		timeout 300 "$@" -p "$port" >"$work/psrv" 2>&1 &
		local srv=$!
		ok=0
		for _ in $(seq 1 40); do
			if timeout 300 "$@" -p "$port" 127.0.0.1 >"$work/pcli" 2>&1; then
				ok=1; break
			fi
			grep -q "Couldn't connect" "$work/pcli" || break
			kill -0 "$srv" 2>/dev/null || break
			sleep 0.25
		done
		wait "$srv"; src=$?
		# the TCP port the two sides meet on may be taken: try another
		grep -q "Couldn't listen" "$work/psrv" || break
	done
	if [ $ok = 1 ] && [ $src = 0 ]; then
		local line fig
		line=$(grep -A1 '#bytes' "$work/pcli" | tail -1)
		case "$1" in
		*_lat) fig=$(echo "$line" | awk '{printf "%s B: typical %s us, avg %s us", $1, $5, $6}') ;;
		*) fig=$(echo "$line" | awk '{printf "%s B: %s MB/s avg, %s MB/s peak", $1, $4, $3}') ;;
		esac
		step "$name" PASS "$fig"
	else
		echo "-- server:"; cat "$work/psrv"; echo "-- client:"; cat "$work/pcli"
		step "$name" FAIL
	fi
}
if command -v ib_send_lat >/dev/null; then
	common=(-d "$dev" -x 3 -F)
	for t in ib_send_lat ib_write_lat ib_read_lat; do
		perf "$t" "${common[@]}" -s 64 -n 1000
		perf "$t" "${common[@]}" -s 65536 -n 100
	done
	for t in ib_send_bw ib_write_bw ib_read_bw; do
		perf "$t" "${common[@]}" -s 64 -n 1000
		perf "$t" "${common[@]}" -s 65536 -n 200
	done
	perf ib_atomic_lat "${common[@]}" -n 1000
	perf ib_atomic_lat "${common[@]}" -n 1000 -A CMP_AND_SWAP
else
	step "perftest (ib_send_lat … ib_atomic_lat)" SKIPPED "perftest not installed"
fi

# 2d. rdma-core's Python tests (python3-pyverbs ships them gzipped under
# /usr/share/doc/rdma-core/tests) on softverbs0, GID 3: no failure and no error; a test skips
# where softverbs, like a generic device, lacks the feature (mlx5/EFA-only, ODP, DM, …).
pytests=/usr/share/doc/rdma-core/tests
if [ -f "$pytests/run_tests.py" ] && [ -x /usr/bin/python3 ]; then
	cp -r "$pytests" "$work/pytests"
	gunzip -f "$work/pytests/"*.gz 2>/dev/null
	timeout 900 /usr/bin/python3 "$work/pytests/run_tests.py" --dev "$dev" --port 1 --gid 3 >"$work/pyverbs" 2>&1
	prc=$?
	summary=$(grep -E '^(Ran |OK|FAILED)' "$work/pyverbs" | tr '\n' ' ')
	if [ $prc = 0 ]; then
		step "rdma-core's Python tests (pyverbs)" PASS "$summary"
	else
		grep -E '^(FAIL|ERROR):' "$work/pyverbs"; tail -40 "$work/pyverbs"
		step "rdma-core's Python tests (pyverbs)" FAIL "$summary"
	fi
else
	step "rdma-core's Python tests (pyverbs)" SKIPPED "python3-pyverbs not installed"
fi

# 2e. UCX over softverbs. UCX lists an IB device only when /dev/infiniband/<dev_name> is a
# character device it may read and write (its uct_ib_device_is_accessible); softverbs has no
# kernel device, so the test makes that node (char 1:3, /dev/null's: softverbs never reads it)
# when it is root, and removes it afterwards if it made it. Then ucx_info must list
# softverbs0:1 with rc_verbs and ud_verbs, and ucx_perftest runs between two processes: UCT
# am_lat on each transport, and UCP tag_lat, ucp_am_lat and ucp_put_bw with UCX_TLS=rc_verbs
# (and ud_verbs, which UCP needs beside rc_verbs to wire up) and with UCX_TLS=ud_verbs; a run
# passes when it ends with its "Final:" line and UCP says it used that transport. Figures are
# printed, never judged.
ucxnode=/dev/infiniband/uverbs_$dev
ucxperf() { # ucxperf NAME TLS-ENV-OR-- WANT ARGS...: run both sides on a free port
	local name=$1 tls=$2 want=$3 ok=0
	shift 3
	for _ in 1 2 3 4 5; do
		local port=$((20000 + RANDOM % 20000))
		env ${tls:+UCX_TLS=$tls} UCX_NET_DEVICES="$dev:1" timeout 120 ucx_perftest "$@" -p "$port" >"$work/usrv" 2>&1 &
		local srv=$!
		for _ in $(seq 1 40); do
			if env ${tls:+UCX_TLS=$tls} UCX_NET_DEVICES="$dev:1" UCX_LOG_LEVEL=info \
				timeout 120 ucx_perftest "$@" -p "$port" 127.0.0.1 >"$work/ucli" 2>&1; then
				ok=1; break
			fi
			grep -q -i "connect" "$work/ucli" || break
			kill -0 "$srv" 2>/dev/null || break
			sleep 0.25
		done
		wait "$srv" || ok=0
		[ $ok = 1 ] && break
		grep -q -i "bind\|address already in use" "$work/usrv" || break
	done
	if [ $ok = 1 ] && grep -q '^Final:' "$work/ucli" && { [ -z "$want" ] || grep -q "$want" "$work/ucli"; }; then
		step "$name" PASS "$(grep '^Final:' "$work/ucli" | awk '{printf "typical %s us, avg %s us, %s MB/s, %s msg/s", $3, $5, $7, $9}')"
	else
		echo "-- server:"; cat "$work/usrv"; echo "-- client:"; cat "$work/ucli"
		step "$name" FAIL
	fi
}
if ! command -v ucx_perftest >/dev/null || ! command -v ucx_info >/dev/null; then
	step "UCX over softverbs (ucx_info, ucx_perftest)" SKIPPED "ucx-utils not installed"
elif [ ! -c "$ucxnode" ] && [ "$(id -u)" != 0 ]; then
	step "UCX over softverbs (ucx_info, ucx_perftest)" SKIPPED "no $ucxnode and not root to make it"
else
	if [ ! -c "$ucxnode" ]; then
		mkdir -p /dev/infiniband && mknod "$ucxnode" c 1 3 && chmod 666 "$ucxnode" && madenode=$ucxnode
	fi
	timeout 60 ucx_info -d >"$work/ucxinfo" 2>&1
	if grep -q "Memory domain: $dev" "$work/ucxinfo" &&
		grep -A1 "Transport: rc_verbs" "$work/ucxinfo" | grep -q "Device: $dev:1" &&
		grep -A1 "Transport: ud_verbs" "$work/ucxinfo" | grep -q "Device: $dev:1"; then
		step "ucx_info -d lists $dev:1 (rc_verbs, ud_verbs)" PASS
	else
		cat "$work/ucxinfo"; step "ucx_info -d lists $dev:1 (rc_verbs, ud_verbs)" FAIL
	fi
	for x in rc_verbs ud_verbs; do
		ucxperf "ucx_perftest -t am_lat -x $x (UCT)" "" "" -d "$dev:1" -x "$x" -t am_lat -n "$iters" -w 100
	done
	for t in tag_lat ucp_am_lat ucp_put_bw; do
		ucxperf "ucx_perftest -t $t, UCX_TLS=rc_verbs" rc_verbs,ud_verbs "ep_cfg.*rc_verbs/$dev:1" \
			-t "$t" -n "$iters" -w 100
		ucxperf "ucx_perftest -t $t, UCX_TLS=ud_verbs" ud_verbs "ep_cfg.*ud_verbs/$dev:1" -t "$t" -n "$iters" -w 100
	done
	[ -z "$madenode" ] || { rm -f "$madenode"; madenode=; }
fi

# 2f. libfabric's verbs provider over softverbs: fi_info lists softverbs0's domains, and
# fi_pingpong runs between two processes over reliable datagram endpoints (verbs UD under
# libfabric's ofi_rxd), 64 B, with data checks (-c). Its MSG (RC) and plain DGRAM endpoints
# need rdma_cm's kernel device (/dev/infiniband/rdma_cm), which no machine without kernel
# RDMA has: they are listed, not run.
if ! command -v fi_info >/dev/null || ! command -v fi_pingpong >/dev/null; then
	step "libfabric over softverbs (fi_info, fi_pingpong)" SKIPPED "libfabric-bin not installed"
else
	timeout 60 fi_info -p verbs >"$work/fiinfo" 2>&1
	if grep -q "domain: $dev\$" "$work/fiinfo" && grep -q "domain: $dev-dgram" "$work/fiinfo"; then
		step "fi_info -p verbs lists $dev, $dev-dgram" PASS
	else
		cat "$work/fiinfo"; step "fi_info -p verbs lists $dev, $dev-dgram" FAIL
	fi
	ok=0
	for _ in 1 2 3 4 5; do
		port=$((20000 + RANDOM % 20000))
		timeout 120 fi_pingpong -p 'verbs;ofi_rxd' -e rdm -I 200 -S 64 -c -B "$port" >"$work/fsrv" 2>&1 &
		srv=$!
		for _ in $(seq 1 40); do
			if timeout 120 fi_pingpong -p 'verbs;ofi_rxd' -e rdm -I 200 -S 64 -c -P "$port" 127.0.0.1 >"$work/fcli" 2>&1; then
				ok=1; break
			fi
			kill -0 "$srv" 2>/dev/null || break
			sleep 0.25
		done
		wait "$srv" || ok=0
		[ $ok = 1 ] && break
		kill "$srv" 2>/dev/null
	done
	if [ $ok = 1 ] && grep -q '^64 ' "$work/fcli"; then
		step "fi_pingpong -p 'verbs;ofi_rxd' -e rdm -c, 64 B" PASS "$(awk '/^64 /{printf "%s us per transfer", $7}' "$work/fcli")"
	else
		echo "-- server:"; cat "$work/fsrv"; echo "-- client:"; cat "$work/fcli"
		step "fi_pingpong -p 'verbs;ofi_rxd' -e rdm -c, 64 B" FAIL
	fi
fi

# 3. sv_test: the C test of verbs semantics and faults.
if timeout 600 "$lib/sv_test"; then
	step "sv_test" PASS
else
	step "sv_test" FAIL
fi

# 4. The cgo verbs provider (its unit tests and the conformance suite) over softverbs, and
# the wire decoder's fuzz targets.
if command -v "$GO" >/dev/null && [ "$("$GO" env CGO_ENABLED)" = 1 ]; then
	if timeout 900 "$GO" test -tags rdma -count=1 ./ibv/verbs/ 2>&1 | tee "$work/gotest"; then
		step "go test -tags rdma ./ibv/verbs/" PASS
	else
		step "go test -tags rdma ./ibv/verbs/" FAIL \
			"$(grep -o -- '--- FAIL: [^ ]*' "$work/gotest" | sed 's/--- FAIL: //' | tr '\n' ' ')"
	fi
	if "$GO" test -tags rdma -count=1 ./ibv/softverbs/fuzz/ &&
		"$GO" test -tags rdma -run '^$' -fuzz '^FuzzDecode$' -fuzztime "${SOFTVERBS_FUZZTIME:-10000x}" ./ibv/softverbs/fuzz/ &&
		"$GO" test -tags rdma -run '^$' -fuzz '^FuzzDecodeTrain$' -fuzztime "${SOFTVERBS_FUZZTIME:-10000x}" ./ibv/softverbs/fuzz/; then
		step "FuzzDecode, FuzzDecodeTrain (wire decoder)" PASS
	else
		step "FuzzDecode, FuzzDecodeTrain (wire decoder)" FAIL
	fi
else
	step "go test -tags rdma ./ibv/verbs/, FuzzDecode" SKIPPED "no go toolchain with cgo"
fi

# 5. The twosided binary built with -tags rdma loads libibverbs at run time: no NEEDED entry
# for it; with softverbs it lists softverbs0; with TWOSIDED_LIBIBVERBS pointing nowhere (a
# host without rdma-core) it still starts, says why, and carries notifies over oob.
if command -v "$GO" >/dev/null && [ "$("$GO" env CGO_ENABLED)" = 1 ]; then
	bin="$work/twosided"
	missing=/nonexistent/libibverbs.so.1
	if ! "$GO" build -tags rdma -o "$bin" ./cmd/twosided 2>"$work/build"; then
		cat "$work/build"; step "twosided -tags rdma: build" FAIL
	else
		if command -v readelf >/dev/null; then
			if readelf -d "$bin" | grep NEEDED | tee "$work/needed" | grep -q libibverbs; then
				cat "$work/needed"; step "twosided -tags rdma: no NEEDED libibverbs" FAIL
			else
				step "twosided -tags rdma: no NEEDED libibverbs" PASS "$(grep -o '\[.*\]' "$work/needed" | tr '\n' ' ')"
			fi
		else
			step "twosided -tags rdma: no NEEDED libibverbs" SKIPPED "readelf not installed"
		fi
		if "$bin" version >"$work/version" 2>&1 &&
			grep -q "^verbs: *compiled in, libibverbs loaded from .*/libibverbs.so.1$" "$work/version" &&
			"$bin" devices >"$work/tsdevices" 2>&1 && grep -q "^hca_id:	$dev$" "$work/tsdevices"; then
			step "twosided version, devices with softverbs" PASS
		else
			cat "$work/version" "$work/tsdevices"; step "twosided version, devices with softverbs" FAIL
		fi
		export TWOSIDED_LIBIBVERBS=$missing
		if "$bin" version >"$work/version" 2>&1 &&
			grep -q "^verbs: *compiled in, libibverbs not loaded: dlopen \"$missing\" (TWOSIDED_LIBIBVERBS): " "$work/version" &&
			"$bin" devices >"$work/tsdevices" 2>&1 && grep -q "^no RDMA device: libibverbs not loaded: " "$work/tsdevices"; then
			step "twosided version, devices without libibverbs" PASS
		else
			cat "$work/version" "$work/tsdevices"; step "twosided version, devices without libibverbs" FAIL
		fi
		timeout 60 "$bin" serve --listen 127.0.0.1:0 --transport oob --expect 1 >"$work/serve" 2>&1 &
		srv=$!
		addr=
		for _ in $(seq 1 200); do
			addr=$(sed -n 's/^serving on \([^ ]*\).*/\1/p' "$work/serve")
			[ -n "$addr" ] && break
			kill -0 "$srv" 2>/dev/null || break
			sleep 0.05
		done
		if [ -n "$addr" ] && timeout 60 "$bin" send --peer "$addr" --transport oob --msg nolib >"$work/send" 2>&1 &&
			wait "$srv" && grep -q '"nolib' "$work/serve"; then
			step "twosided serve/send over oob without libibverbs" PASS
		else
			kill "$srv" 2>/dev/null; wait "$srv" 2>/dev/null
			cat "$work/serve" "$work/send" 2>/dev/null; step "twosided serve/send over oob without libibverbs" FAIL
		fi
		unset TWOSIDED_LIBIBVERBS
	fi
else
	step "twosided -tags rdma binary" SKIPPED "no go toolchain with cgo"
fi

echo
echo "softverbs-test summary:"
printf '  %s\n' "${results[@]}"
exit $failed
