package main

import (
	"context"
	"flag"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/twosided/twosided/notify"
	_ "github.com/twosided/twosided/notify/directory/etcd"  // --metadata etcd://…, MC_METADATA_SERVER
	_ "github.com/twosided/twosided/notify/directory/http"  // --metadata http://host:port/path
	_ "github.com/twosided/twosided/notify/directory/redis" // --metadata redis://host:port
)

// dirFlags are the directory settings: --metadata for serve and send, --name (the server
// name to register) for serve. MC_METADATA_SERVER and MC_METADATA_CLUSTER_ID apply first
// (notify.FromEnv); a flag given overrides them.
type dirFlags struct {
	metadata  string
	clusterID string
	name      string
	ttl       time.Duration
}

func (f *dirFlags) define(fs *flag.FlagSet) {
	fs.StringVar(&f.metadata, "metadata", "", "metadata service: P2PHANDSHAKE, etcd://host:2379[,host:2379], redis://host:6379 (MC_REDIS_* variables) or http://host:8080/metadata (default MC_METADATA_SERVER, else none: peers are host:port)")
	fs.StringVar(&f.clusterID, "cluster-id", "", "keys under mooncake/<id>/rpc_meta/ (default MC_METADATA_CLUSTER_ID)")
}

// defineName adds serve's --name and --lease-ttl.
func (f *dirFlags) defineName(fs *flag.FlagSet) {
	fs.StringVar(&f.name, "name", "", "server name to register in the metadata service (peers then send to it by name)")
	fs.DurationVar(&f.ttl, "lease-ttl", 0, "TTL of the registration, whole seconds (default 10s): a killed server's entry goes within it (etcd, redis, twosided metadata-server)")
}

func (f *dirFlags) options() []notify.Option {
	var opts []notify.Option
	if f.metadata != "" {
		opts = append(opts, notify.WithMetadata(f.metadata))
	}
	if f.clusterID != "" {
		opts = append(opts, notify.WithMetadataClusterID(f.clusterID))
	}
	if f.name != "" {
		opts = append(opts, notify.WithServerName(f.name))
	}
	if f.ttl != 0 {
		opts = append(opts, notify.WithDirectoryTTL(f.ttl))
	}
	return opts
}

// quietRedisLog drops go-redis's own log lines: during an outage its pool prints one per
// failed dial on stderr, while the directory says once that Redis is unreachable and
// again when it is back (the engine's log).
type quietRedisLog struct{}

func (quietRedisLog) Printf(context.Context, string, ...any) {}

func init() { goredis.SetLogger(quietRedisLog{}) }
