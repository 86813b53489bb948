//go:build rdma

package notify

// With the rdma build tag the engine also sees libibverbs devices; device choice puts them
// before the soft provider's.
import _ "github.com/twosided/twosided/ibv/verbs"
