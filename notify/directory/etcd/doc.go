// Package etcd is the etcd backend of package directory: server names in the keys a
// Mooncake cluster uses (mooncake/[cluster id/]rpc_meta/<name>), registered under a lease
// kept alive and resolved through a cache that one watch keeps current.
//
// Status: API. It is a package of its own so that a program that names peers by host:port
// does not link the etcd client, gRPC and zap: package notify does not import it.
//
// Link it in one of two ways:
//
//   - By a registration import, as database/sql drivers are:
//
//     import _ "github.com/twosided/twosided/notify/directory/etcd"
//
//     Then notify.WithMetadata("etcd://10.0.0.1:2379"), MC_METADATA_SERVER under
//     notify.FromEnv, and directory.Open accept etcd connection strings; the engine opens the
//     directory and closes it on Close. Without the import, New and FromEnv fail with
//     notify.ErrConfig naming this import.
//
//   - Explicitly: d, err := etcd.Open("etcd://10.0.0.1:2379", directory.Config{…}), then
//     notify.WithDirectory(d) on any number of engines; the caller closes d after them.
//
// How the cache, the leases and a peer's restart behave is described in package
// directory's documentation and in docs/directory.md.
package etcd
