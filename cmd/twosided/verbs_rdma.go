//go:build rdma

package main

// The libibverbs provider exists only in builds with -tags rdma; without it, `devices`
// says the verbs provider is not built in.
import _ "github.com/twosided/twosided/ibv/verbs"
