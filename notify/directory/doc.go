// Package directory finds notify engines by server name, in the keys a Mooncake cluster uses.
//
// Status: API. An application uses it through notify (WithMetadata, WithServerName,
// Resolve) or plugs its own Directory in with notify.WithDirectory; the Directory interface
// and ParseConn are kept stable with notify's.
//
// A Mooncake node reaches a peer by its server name: it reads
// mooncake/[MC_METADATA_CLUSTER_ID/]rpc_meta/<name>, a JSON value
// {"ip_or_host_name": …, "rpc_port": …}, and opens the handshake daemon there
// (transfer_metadata.cpp: addRpcMetaEntry, getRpcMetaEntry, removeRpcMetaEntry). This
// package reads and writes that same layout, so a Mooncake node resolves a twosided engine
// by its server name and a twosided engine resolves Mooncake nodes.
//
// Four backends, chosen by the metadata connection string Mooncake uses (ParseConn):
//   - P2P ("P2PHANDSHAKE"): a name is host:port; nothing runs, nothing is registered.
//     Built in.
//   - etcd ("etcd://h1:2379,h2:2379", or a bare "h1:2379" as Mooncake reads it): names live
//     in etcd. A registration is put under a lease that is kept alive, so the entry of a
//     crashed process disappears within the lease TTL (Mooncake's entries have no lease and
//     outlive their process); Unregister revokes the lease. Resolutions are cached and the
//     cache is kept current by one watch on the rpc_meta prefix, so a peer that restarts on a
//     new address is seen there as soon as the watch delivers its put, and cached names keep
//     resolving while etcd is down.
//   - redis ("redis://host:port", "rediss://" for TLS; MC_REDIS_USERNAME, MC_REDIS_PASSWORD,
//     MC_REDIS_DB_INDEX): plain GET/SET/DEL of the same keys. A registration is SET with the
//     TTL and refreshed, so the entry of a crashed process expires within it.
//   - http ("http://host:port/path", "https://"): a Mooncake HTTP metadata server
//     (GET/PUT/DELETE path?key=). The protocol has no TTL: a registration is put again while
//     the engine lives and deleted on Close; `twosided metadata-server` (package
//     metaserver) honours the TTL header the backend sends.
//
// The redis and http backends have no watch: their cache is kept current by polling the
// names in use every Config.Poll (docs/directory.md).
//
// Each backend is a package of its own (notify/directory/etcd, /redis, /http), which a
// program links in with a registration import, as database/sql drivers are:
//
//	import _ "github.com/twosided/twosided/notify/directory/etcd"
//
// Neither this package nor notify imports them, so a program that never names peers through
// a service does not link its client. Without the import, Open and CheckConn fail with
// ErrBadConn naming it (and notify.New with notify.ErrConfig). A backend registers itself
// with RegisterBackend.
//
// A backend owns its client and the goroutines that keep the cache and the registrations.
// It knows nothing of engines, channels or the reactor: Cached never waits, Resolve waits
// on the service only within its context, and no call is made on a reactor thread by this
// package. Every map fed by a service (the cache) is bounded.
package directory
