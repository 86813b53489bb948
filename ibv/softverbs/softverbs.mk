# softverbs: a userspace libibverbs.so.1 written in C (ibv/softverbs/README.md), included by the
# top Makefile. Paths are relative to the repository root.
#
#   make softverbs       build build/softverbs/libibverbs.so.1 and build/softverbs/sv_test
#   make softverbs-test  build, then run ibv/softverbs/test.sh: the exported symbol set against
#                        the system's rdma-core libibverbs.so.1, perftest, pyverbs and the
#                        provider libraries loading with every symbol bound, ibv_devices,
#                        ibv_devinfo -v, ibv_rc_pingpong (polling and -e) between two
#                        processes, the same in InfiniBand mode (SOFTVERBS_LINK=ib: a LID, one
#                        GID, pingpong without -g), perftest's seven programs at 64 B and
#                        64 KiB, sv_test, the cgo verbs provider's tests (go test -tags rdma
#                        ./ibv/verbs/) and the wire decoder's fuzz target, all over
#                        softverbs; then the twosided binary built with -tags rdma: no
#                        NEEDED libibverbs (it dlopens it), version and devices with
#                        softverbs and with TWOSIDED_LIBIBVERBS pointing nowhere, and a send
#                        over oob without libibverbs
#
# Needs a C compiler ($(CC), default cc) and libibverbs-dev's headers; the pingpong checks
# need ibverbs-utils, the perftest checks perftest (make rdma-deps installs both). Without the headers both targets say SKIPPED and succeed, as `make rdma`
# does.

# The fragment leaves the including Makefile's default goal as it was.
SOFTVERBS_SAVED_GOAL := $(.DEFAULT_GOAL)

SOFTVERBS_DIR    := ibv/softverbs
SOFTVERBS_OUT    := build/softverbs
SOFTVERBS_LIB    := $(SOFTVERBS_OUT)/libibverbs.so.1
SOFTVERBS_TEST   := $(SOFTVERBS_OUT)/sv_test
SOFTVERBS_SRCS   := $(SOFTVERBS_DIR)/compat.c $(SOFTVERBS_DIR)/device.c $(SOFTVERBS_DIR)/verbs.c $(SOFTVERBS_DIR)/wire.c
SOFTVERBS_HDRS   := $(SOFTVERBS_DIR)/sv.h $(SOFTVERBS_DIR)/wire.h
SOFTVERBS_CFLAGS ?= -Wall -Wextra -O2
SOFTVERBS_VERBS_H ?= /usr/include/infiniband/verbs.h

.PHONY: softverbs softverbs-test

ifneq ($(wildcard $(SOFTVERBS_VERBS_H)),)

softverbs: $(SOFTVERBS_LIB) $(SOFTVERBS_TEST)

$(SOFTVERBS_LIB): $(SOFTVERBS_SRCS) $(SOFTVERBS_HDRS) $(SOFTVERBS_DIR)/libibverbs.map
	@mkdir -p $(SOFTVERBS_OUT)
	$(CC) $(SOFTVERBS_CFLAGS) -fPIC -shared -pthread -fvisibility=hidden \
		-Wl,--version-script=$(SOFTVERBS_DIR)/libibverbs.map -Wl,-soname,libibverbs.so.1 \
		-o $@ $(SOFTVERBS_SRCS)

$(SOFTVERBS_TEST): $(SOFTVERBS_DIR)/sv_test.c $(SOFTVERBS_LIB)
	$(CC) $(SOFTVERBS_CFLAGS) -pthread -o $@ $< -L$(SOFTVERBS_OUT) -l:libibverbs.so.1 \
		-Wl,-rpath,'$$ORIGIN'

softverbs-test: softverbs
	GO="$(or $(GO),go)" bash $(SOFTVERBS_DIR)/test.sh

else

softverbs softverbs-test:
	@echo "$@: SKIPPED: $(SOFTVERBS_VERBS_H) not found (install libibverbs-dev); softverbs was not built or tested"

endif

.DEFAULT_GOAL := $(SOFTVERBS_SAVED_GOAL)
