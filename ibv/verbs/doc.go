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
// Without RDMA support in the kernel, ibv_get_device_list fails with ENOSYS; the provider
// then reports an error wrapping ibv.ErrNoDevice that says so.
package verbs
