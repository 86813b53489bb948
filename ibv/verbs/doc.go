//go:build rdma

// Package verbs is the libibverbs provider of twosided, built only with the build tag
// "rdma" (the default build stays pure Go). It registers itself as provider "verbs" and
// implements every interface of package ibv over libibverbs through cgo, in the plain
// verbs order: device list, context, PD, MR, completion channel, CQ, RC QP, post, poll.
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
