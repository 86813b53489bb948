# twosided build and check targets. `make test` is what CI runs (.ci/run) on a clean clone.
#
#   make test        vet, gofmt check, unit tests with -race (after test-deps: redis-server
#                    for the directory's Redis tests), the allocation tests without -race
#                    (the race detector allocates, so they skip under it), the
#                    tracepoints build (-tags tracepoints: vet, its recorder's tests), short
#                    fuzzing, then the cgo verbs provider (build tag rdma) on softverbs, the
#                    userspace libibverbs of ibv/softverbs: vet, its tests and the conformance
#                    suite, ibv_devinfo and ibv_rc_pingpong, and the engine's tests (notify,
#                    tests/), twosided's doctor and the bench with the verbs provider as the
#                    engines' device
#   make build       build every package (go build ./cmd/twosided for the binary)
#   make fuzz        every Fuzz target in the tree for FUZZTIME each (default 200000x); those
#                    of -tags rdma too (softverbs' wire decoder) when cgo and libibverbs-dev's
#                    headers are there
#   make fuzz-short  every Fuzz target for FUZZTIME_SHORT each (default 10000x), as make fuzz
#
# Fuzz budgets are execution counts, not durations: with a duration, Go 1.26's fuzzing
# coordinator can fail a target with a bare "context deadline exceeded" when the time runs
# out while a worker is mid-call on a loaded machine (golang/go#75804, fixed in Go 1.27).
# 10000x is ~3-10 s for the slowest targets here (the peer machine and window fuzzers) and
# well under a second for the decoders.
#   make bench       benchmarks, BENCHTIME each (default 1s)
#   make bench-anchors  twosided bench's latency and burst rows (oob, rdma_twosided on the soft
#                    provider, the TCP floors) with UCX's ucx_perftest over UCX_TLS=tcp beside
#                    them (--anchors ucx; a line says so when ucx_perftest is not installed);
#                    BENCH_FLAGS adds flags; build/bench-anchors.json and .svg
#   make bench-targets  the stack's cost against its references (floor-block, floor-spin, UCX,
#                    floor-verbs on softverbs), three alternating rounds in one run, and for
#                    each target the median and whether it is met (bench/targets.sh; R=rounds)
#   make soak        the delivery contract checked end to end under faults for DURATION
#                    (default 1h) on the soft provider, then on the verbs provider over
#                    softverbs when it builds (SOAK_FLAGS adds flags, e.g. --seed n or
#                    --faults kill,stop); figures in build/soak-*.json; exit 1 on a violation

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c

GO             ?= go
PKGS           ?= ./...
FUZZTIME       ?= 200000x
FUZZTIME_SHORT ?= 10000x
BENCHTIME      ?= 1s
TEST_TIMEOUT   ?= 45m
DURATION       ?= 1h
SOAK_FLAGS     ?=
BENCH_FLAGS    ?=
VERBS_H        ?= /usr/include/infiniband/verbs.h
PINGPONG       ?= /usr/bin/ibv_rc_pingpong
REDIS_SERVER   ?= redis-server
PERFTEST       ?= /usr/bin/ib_send_lat
PYVERBS        ?= /usr/lib/python3/dist-packages/pyverbs
UCX_PERFTEST   ?= /usr/bin/ucx_perftest
FI_PINGPONG    ?= /usr/bin/fi_pingpong
SOFTVERBS_LIBDIR := $(CURDIR)/build/softverbs

include ibv/softverbs/softverbs.mk

.PHONY: test build vet fmt-check unit allocs tracepoints fuzz fuzz-short bench bench-anchors bench-targets rdma rdma-deps test-deps soak

test: vet fmt-check unit allocs tracepoints fuzz-short rdma

build:
	$(GO) build $(PKGS)

vet:
	$(GO) vet $(PKGS)

fmt-check:
	@files="$$(gofmt -l .)"; \
	if [ -n "$$files" ]; then echo "gofmt -l: these files are not gofmt'ed:"; echo "$$files"; exit 1; fi

# TEST_TIMEOUT bounds each test binary: tests/ runs ~5 min on a quiet 2-core machine and
# 2-3 times that beside other load, past go test's default of 10 min.
unit: test-deps
	$(GO) test -race -timeout $(TEST_TIMEOUT) $(PKGS)

# tracepoints: the build with the segment profile's stamps (-tags tracepoints, see
# internal/tracepoint and bench/segments) compiles, and its recorder and table work.
tracepoints:
	$(GO) vet -tags tracepoints ./internal/... ./bench/... ./cmd/... ./oob/ ./reactor/ ./notify/
	$(GO) test -count=1 -tags tracepoints ./internal/tracepoint/ ./bench/segments/

# allocs runs the allocation tests (testing.AllocsPerRun) without the race detector, whose
# instrumentation allocates: under -race they skip.
allocs:
	$(GO) test -count=1 -run 'Allocs' $(PKGS)

# run-fuzz runs every Fuzz target of $(PKGS) for $(1) each. Targets are found with
# `go test -list '^Fuzz'`, which prints a package's target names and then its "ok" line.
# Where the rdma prerequisites are (libibverbs-dev's $(VERBS_H) and cgo), the targets that
# exist only with -tags rdma (softverbs' wire decoder, FuzzDecode of ibv/softverbs/fuzz) are
# listed and run with it too; elsewhere a line says they were left out.
define run-fuzz
	@list() { $(GO) test "$$@" -list '^Fuzz' $(PKGS) | \
		awk '/^Fuzz/ { names = names " " $$1; next } \
		     /^ok/   { k = split(names, n, " "); for (i = 1; i <= k; i++) print $$2, n[i]; names = "" }'; }; \
	plain="$$(list)"; \
	targets="$$(sed -n 's/./- &/p' <<< "$$plain")"; \
	if [ -f "$(VERBS_H)" ] && [ "$$($(GO) env CGO_ENABLED)" = 1 ]; then \
		rdma="$$(list -tags rdma | awk 'NR == FNR { seen[$$0] = 1; next } !seen[$$0]' <(echo "$$plain") -)"; \
		targets="$$targets$${rdma:+$$'\n'}$$(sed -n 's/./rdma &/p' <<< "$$rdma")"; \
	else \
		echo "fuzz: the rdma-tagged targets (-tags rdma) are left out: no $(VERBS_H) or cgo disabled"; \
	fi; \
	if [ -z "$$targets" ]; then echo "fuzz: no Fuzz targets found"; exit 0; fi; \
	while read -r tags pkg name; do \
		flags=(); [ "$$tags" = rdma ] && flags=(-tags rdma); \
		echo "fuzz: $$pkg $$name$${flags:+ (-tags rdma)} for $(1)"; \
		$(GO) test "$${flags[@]}" -run '^$$' -fuzz "^$$name\$$" -fuzztime $(1) "$$pkg"; \
	done <<< "$$targets"
endef

fuzz:
	$(call run-fuzz,$(FUZZTIME))

fuzz-short:
	$(call run-fuzz,$(FUZZTIME_SHORT))

bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) $(PKGS)

bench-anchors:
	@mkdir -p build
	$(GO) build -o build/twosided ./cmd/twosided
	build/twosided bench --scenario latency,burst --transport oob,rdma_twosided,floor-block,floor-spin,floor-stream \
		--provider soft --anchors ucx --json build/bench-anchors.json --plot build/bench-anchors.svg $(BENCH_FLAGS)

bench-targets: rdma-deps
	$(MAKE) --no-print-directory softverbs
	bash bench/targets.sh

# soak runs `twosided soak` for DURATION on each provider; the verbs run needs libibverbs-dev's
# headers and cgo (softverbs), else it says it was left out.
soak:
	@mkdir -p build; \
	$(GO) build -o build/twosided ./cmd/twosided; \
	echo "soak: the soft provider for $(DURATION)"; \
	build/twosided soak --duration $(DURATION) --provider soft --json build/soak-soft.json $(SOAK_FLAGS); \
	if [ ! -f "$(VERBS_H)" ] || [ "$$($(GO) env CGO_ENABLED)" != 1 ]; then \
		echo "soak: the verbs provider is left out: no $(VERBS_H) or cgo disabled"; exit 0; \
	fi; \
	$(MAKE) --no-print-directory softverbs; \
	$(GO) build -tags rdma -o build/twosided-rdma ./cmd/twosided; \
	echo "soak: the verbs provider on softverbs for $(DURATION)"; \
	LD_LIBRARY_PATH="$(SOFTVERBS_LIBDIR)$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}" \
		build/twosided-rdma soak --duration $(DURATION) --provider verbs --json build/soak-verbs.json $(SOAK_FLAGS)

# rdma-deps installs the libibverbs headers (libibverbs-dev), rdma-core's example programs
# (ibverbs-utils: ibv_devinfo, ibv_rc_pingpong), perftest (ib_send_lat … ib_atomic_lat) and
# pyverbs with rdma-core's Python tests (python3-pyverbs), UCX's ucx_info and ucx_perftest
# (ucx-utils) and libfabric's fi_info and fi_pingpong (libfabric-bin) when they are missing and we are root.
rdma-deps:
	@if [ -f "$(VERBS_H)" ] && [ -x "$(PINGPONG)" ] && [ -x "$(PERFTEST)" ] && [ -d "$(PYVERBS)" ] && \
		[ -x "$(UCX_PERFTEST)" ] && [ -x "$(FI_PINGPONG)" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ]; then exit 0; fi; \
	if ! command -v apt-get >/dev/null; then exit 0; fi; \
	echo "rdma: installing libibverbs-dev, ibverbs-utils, perftest, python3-pyverbs, ucx-utils and libfabric-bin"; \
	apt-get update; \
	DEBIAN_FRONTEND=noninteractive apt-get install -y libibverbs-dev ibverbs-utils perftest python3-pyverbs ucx-utils libfabric-bin

# test-deps installs the services the unit tests start themselves: Debian's redis-server (the
# directory's Redis backend is tested against it) when it is missing and we are root;
# elsewhere those tests skip, saying so.
test-deps:
	@if command -v $(REDIS_SERVER) >/dev/null; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
		echo "test-deps: no $(REDIS_SERVER) and cannot install it (needs root and apt-get): the Redis directory tests skip"; exit 0; \
	fi; \
	echo "test-deps: installing redis-server"; \
	apt-get update; \
	DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server

# rdma vets and tests the cgo verbs provider; without headers (and no root to install them)
# it says so and skips only this part.
rdma: rdma-deps
	@if [ ! -f "$(VERBS_H)" ]; then \
		echo "rdma: SKIPPED: $(VERBS_H) not found and cannot install libibverbs-dev" \
		     "(needs root and apt-get); the cgo verbs provider (-tags rdma) was not checked"; \
		exit 0; \
	fi; \
	if [ "$$($(GO) env CGO_ENABLED)" != 1 ]; then \
		echo "rdma: SKIPPED: cgo is disabled (no C compiler?); the verbs provider was not checked"; \
		exit 0; \
	fi; \
	echo "$(GO) vet -tags rdma $(PKGS)"; $(GO) vet -tags rdma $(PKGS); \
	$(MAKE) --no-print-directory softverbs-test; \
	export LD_LIBRARY_PATH="$(SOFTVERBS_LIBDIR)$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}"; \
	echo "rdma: the verbs provider on softverbs: $(GO) test -race -tags rdma ./ibv/... ./notify/... ./cmd/... ./bench/..."; \
	$(GO) test -race -timeout $(TEST_TIMEOUT) -tags rdma ./ibv/... ./notify/... ./cmd/... ./bench/...; \
	echo "rdma: the end-to-end tests with the verbs provider: $(GO) test -tags rdma ./tests/"; \
	$(GO) test -timeout $(TEST_TIMEOUT) -tags rdma -count=1 ./tests/
