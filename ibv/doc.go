// Package ibv is the verbs API of twosided: Go types and interfaces that follow libibverbs
// closely (device list, context, PD, MR, completion channel, CQ, RC QP, work requests, work
// completions, async events), so that a verbs programmer reads it as ibv_*.
//
// Status: an internal layer of twosided, kept importable for the benchmark and the tools
// (cmd/twosided, bench, tests). Its API may change without notice; applications use
// package notify. docs/design.md describes how the layers fit together.
//
// The package owns only the API and the provider registry. It performs no I/O. Providers
// implement it: ibv/soft (a software RC provider over TCP, always built) and ibv/verbs
// (libibverbs through cgo, build tag "rdma"). A provider registers itself in its package's
// init; importing it for side effects makes its devices visible to GetDeviceList.
//
// Concurrency: like libibverbs, a QP's send queue, a QP's receive queue and a CQ may each be
// used from one goroutine at a time; twosided's reactor owns them all on one OS thread.
package ibv
