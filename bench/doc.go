// Package bench is twosided's benchmark: the scenarios (latency, burst, bidi, fanin, fanout,
// idle, connect), the transports they run over (rdma_twosided on the device an engine picks:
// the soft provider's by default, a libibverbs device with --provider verbs, or by default
// when the binary is built with -tags rdma and libibverbs lists one with an active port; oob
// with persistent connections, oob-classic with one TCP connection per notify, as Mooncake's
// classic notify does) and the floors, minimal TCP ping-pongs on locked OS threads
// (floor-block: blocking reads, one kernel wake-up per message; floor-spin: non-blocking
// reads in a spin loop; floor-epoll, floor-loop, floor-node and floor-uring, asked for by
// name: floor-block's exchange waited for as the reactor waits, epoll_wait and ExecWait's
// disarm, with no engine; the same on the reactor itself; the same as the engine's OOB
// frames through an oob.Node on it, with no notify engine; or through io_uring; and
// floor-echo, floor-block's threads moving the engines' echoed round trip: the receiving
// thread sends every message back on its own connection, each message acked), the verbs
// floors on the device (floor-verbs, floor-verbs-spin, and floor-verbs-echo: the echoed
// round trip's SENDs), HDR histograms of the latencies, CPU and wake-up accounting, a check
// of how evenly the CPUs run (cpucheck.go), the table, JSON and SVG outputs, and the
// harness that puts the receiving side in a second process: a child (the binary
// re-executes itself; control travels over the child's stdin and stdout) or a bench server
// on another host (Server, NewServer: the same control protocol on a TCP connection of its
// own, after a versioned hello; proto.go). Pipelined runs are repeated, timed to a steady
// state without a count, and reported with their spread; UCX's ucx_perftest can run beside
// them as an anchor (anchors.go).
//
// Status: an internal layer of twosided, kept importable for the benchmark and the tools
// (cmd/twosided, bench, tests). Its API may change without notice; applications use
// package notify. docs/design.md describes how the layers fit together.
//
// It owns its own sockets (floors, classic client) and the engines it creates. It must not
// reach into the engine's internals: it uses notify's public API only (New, SendNotify,
// WithHandler, Stats, Close). floor-loop and floor-node build on the layers below the
// engine (package reactor, package oob) through their own APIs, to measure each layer.
//
// Latency. In one process, one-way latency is measured on one monotonic clock, from the
// start of SendNotify to the receiver's delivery (the handler, on the receiver's reactor
// thread). In two processes the clocks of the Go runtimes differ, so the receiver echoes
// every notify back and one-way is half the round trip; the table says so. Across hosts
// only round trips are timed: the two hosts' clocks are never compared, and the per-hop
// breakdown (CLOCK_MONOTONIC stamps of both processes) runs only on one host. Call latency
// is the duration of the SendNotify call.
//
// The hot paths (a send, a delivery, a histogram record) allocate nothing per notify:
// messages, names and timestamps are allocated before the measured phase.
package bench
