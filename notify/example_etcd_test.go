package notify_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/twosided/twosided/notify"
	_ "github.com/twosided/twosided/notify/directory/etcd" // etcd:// connection strings for WithMetadata
	"github.com/twosided/twosided/notify/directory/etcdtest"
)

// cluster is the Mooncake cluster id the engines share (MC_METADATA_CLUSTER_ID).
const cluster = "example"

// Engines registered under server names in etcd, in Mooncake's keys
// (mooncake/<cluster id>/rpc_meta/<name>), reach each other by name. The etcd here is an
// embedded one-member server for the example; give WithMetadata your own, e.g.
// "etcd://10.0.0.1:2379,10.0.0.2:2379". The blank import of notify/directory/etcd links the
// etcd backend: without it (or an explicit WithDirectory) New refuses an etcd:// string.
func ExampleWithServerName() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	dir, err := os.MkdirTemp("", "etcd-example")
	if err != nil {
		log.Fatal(err)
	}
	etcd, err := etcdtest.New(dir)
	if err != nil {
		log.Fatal(err)
	}
	defer etcd.Close()

	decode, err := notify.New(
		notify.WithListenAddr("127.0.0.1:0"),
		notify.WithMetadata(etcd.Conn()),
		notify.WithMetadataClusterID(cluster),
		notify.WithServerName("decode-0"), // registered under a lease, removed by Close
	)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = decode.Close(context.Background()) }()
	prefill, err := notify.New(
		notify.WithListenAddr("127.0.0.1:0"),
		notify.WithMetadata(etcd.Conn()),
		notify.WithMetadataClusterID(cluster),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = prefill.Close(context.Background()) }()

	err = prefill.SendNotify(ctx, "decode-0", notify.Notify{Name: "kv_ready", Msg: []byte("req-9")})
	switch {
	case errors.Is(err, notify.ErrPeerUnknown):
		log.Fatal("no such server name: ", err)
	case errors.Is(err, notify.ErrDirectoryUnavailable):
		log.Fatal("etcd did not answer in time: ", err)
	case err != nil:
		log.Fatal(err)
	}
	n, err := decode.Recv(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(n.Name, string(n.Msg))
	// Output: kv_ready req-9
}
