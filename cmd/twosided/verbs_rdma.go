//go:build rdma

package main

// The libibverbs provider exists only in builds with -tags rdma; without it, `version` and
// `devices` say the verbs provider is not compiled in. With it, the binary still starts on
// a host without rdma-core: the provider dlopens libibverbs.so.1 at its first use
// (TWOSIDED_LIBIBVERBS names another), and `version` and `devices` say where it was loaded
// from or why not.
import _ "github.com/twosided/twosided/ibv/verbs"
