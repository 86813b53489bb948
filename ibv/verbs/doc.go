//go:build rdma

// Package verbs is the libibverbs provider of twosided, built only with the build tag
// "rdma" (the default build stays pure Go). It registers itself as provider "verbs" and
// implements every interface of package ibv over libibverbs through cgo, in the plain
// verbs order: device list, context, PD, MR, completion channel, CQ, RC QP, post, poll.
//
// Loading libibverbs. The binary does not link libibverbs: it needs only libc to start, on
// any host. The first use of the provider (GetDeviceList, Open, ForkInit, Library) loads
// libibverbs.so.1 with dlopen(RTLD_NOW | RTLD_LOCAL) and resolves each entry point it
// calls once, with dlvsym at the symbol version rdma-core exports (ibv_*@IBVERBS_1.1, the
// completion channel calls @IBVERBS_1.0; their IBVERBS_1.0 twins are an older ABI), into a
// table of function pointers in shim.c. RTLD_NOW binds libibverbs' own symbols at load, so
// a broken install fails there, with dlerror's text, and not at a later call; RTLD_LOCAL
// keeps its symbols out of the process's global scope, where they could clash with another
// copy (rdma-core's drivers, libmlx5-rdmav34.so and the like, need libibverbs.so.1 and
// find this one through it). _ibv_query_gid_table (IBVERBS_1.11, rdma-core v31) is
// optional: without it each port shows GID 0 only. The verbs that libibverbs inlines
// through context->ops (ibv_post_send, ibv_post_recv, ibv_poll_cq, ibv_req_notify_cq) need
// no symbol and cost what they did. shim.h poisons the exported names, so a direct call
// fails to compile; TestNoLinkTimeLibibverbs checks the test binary lists no NEEDED
// libibverbs and imports no ibv_ symbol.
//
// The library is found the way dlopen finds "libibverbs.so.1" (LD_LIBRARY_PATH, the ld.so
// cache, the system directories), unless TWOSIDED_LIBIBVERBS names another (EnvLibrary; a
// path with a slash is opened as it is), e.g. TWOSIDED_LIBIBVERBS=/opt/rdma-core/lib/libibverbs.so.1
// for an install outside the search path, or a path that does not exist to test a host
// without rdma-core. It is read once, at the first use.
//
// Before dlopen sees the file (the path given, or the one LD_LIBRARY_PATH leads to),
// checkLibraryFile reads it with debug/elf: an ELF shared object whose headers, load
// segments and sections lie inside the file, whose dynamic symbol table defines each entry
// point at rdma-core's version. dlopen maps a copy cut short as if it were whole and dies of
// SIGBUS on the first missing page; a library without symbol versions satisfies dlvsym with
// whatever it exports under the name. A library found through the ld.so cache or the
// system directories is checked after a dlopen that only finds its path.
//
// When the load fails (no such library, a file the check refuses, or a library without an
// entry point the provider needs) it is not tried again: every call returns the same error, which wraps
// ibv.ErrNoDevice and ErrLibrary and quotes dlerror, e.g. "no RDMA device: libibverbs not
// loaded: dlopen "libibverbs.so.1": libibverbs.so.1: cannot open shared object file: No
// such file or directory (...)". The provider then lists zero devices, Open fails,
// ForkInit does nothing (nothing can be registered), and an rdma_twosided engine goes on
// with the soft provider; one forced onto the verbs provider fails with that error. The
// provider itself prints nothing: Provider.Library says where libibverbs was loaded from
// or why not, which `twosided version` and `twosided devices` show.
//
// Build tag. The provider stays behind -tags rdma, also now that its binary runs anywhere:
// compiling it still needs cgo, a C compiler and rdma-core's headers (libibverbs-dev), which
// a plain `go build`, `go install` or CGO_ENABLED=0 cross build does not have, and the
// default build must succeed on any machine Go runs on. A binary built with -tags rdma on
// one machine runs on hosts with or without rdma-core (it needs the C library it was built
// against, glibc 2.34 or later when built on such a system), so a distribution can ship
// that one binary.
//
// Status: an internal layer of twosided, kept importable for the benchmark and the tools
// (cmd/twosided, bench, tests). Its API may change without notice; applications use
// package notify. docs/design.md describes how the layers fit together.
//
// It owns the translation between ibv's Go types and libibverbs' C structs, the integer
// handles that stand in for Go objects in cq_context and qp_context, and the C memory the
// hot paths use (per-CQ WC arrays, per-QP WR and SGE arrays). It must not touch protocol
// state, sockets or goroutines: it starts none and blocks nowhere. The completion-channel
// fd and the async fd are non-blocking, so GetEvent and GetAsyncEvent return
// ibv.ErrWouldBlock instead of waiting; the caller's reactor waits for them in epoll.
//
// Memory rules. cgo forbids C from keeping a Go pointer after a call returns, and a NIC
// keeps the address of a registered buffer until deregistration. RegMR therefore pins the
// buffer with a runtime.Pinner for the MR's lifetime and unpins it in Dereg; the pin also
// keeps the buffer alive while only the NIC refers to it. Everything else handed to C
// (work requests, SGEs, work completions) lives in C memory allocated per object, so Poll,
// PostSend and PostRecv allocate nothing and pass no Go pointer.
//
// Completion vectors. The i-th CQ of a context is created on completion vector
// i % num_comp_vectors, so that the interrupts of many CQs are spread over the device's
// vectors (and so over cores) instead of all landing on vector 0.
//
// Fork safety. Registered memory and fork(2) do not mix on kernels older than 5.13: a
// child's copy-on-write could leave the NIC writing into pages the parent no longer maps.
// Provider.ForkInit (ibv.ForkIniter) calls ibv_fork_init, which marks registered memory
// MADV_DONTFORK; it must run before any memory is registered. notify calls it before it
// opens its device when asked (notify.WithForkSafe, TWOSIDED_FORK_SAFE=1, in the limits
// table); setting libibverbs' own RDMAV_FORK_SAFE does the same. Go's os/exec forks with
// CLONE_VM|CLONE_VFORK and shares no pages with the child, so only code that calls fork
// itself needs this.
//
// A failed ibv_dereg_mr leaves the buffer pinned and the MR kept in a package list (the NIC
// may still write into it; a dropped Pinner would make Go panic), until a later Dereg or
// its PD's Dealloc succeeds; StuckMRs counts them.
//
// Without RDMA support in the kernel, ibv_get_device_list fails with ENOSYS; the provider
// then reports an error wrapping ibv.ErrNoDevice that says so.
package verbs
