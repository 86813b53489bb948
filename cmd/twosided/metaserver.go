package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/twosided/twosided/notify/directory/metaserver"
)

func init() {
	register(&command{
		Name: "metadata-server",
		Summary: "An HTTP metadata server speaking Mooncake's protocol (GET/PUT/DELETE <path>?key=), for\n" +
			"MC_METADATA_SERVER=http://host:port/metadata: a small cluster needs no etcd or Redis.",
		Usage: "[--listen host:port] [--path /metadata] [--tls-cert file --tls-key file] [--max-keys n] [--max-value bytes] [--max-bytes bytes] [--max-ttl d]",
		Run:   runMetadataServer,
	})
}

func runMetadataServer(ctx context.Context, fs *flag.FlagSet, args []string, stdout io.Writer) error {
	listen := fs.String("listen", ":8080", "address to serve on (Mooncake's example's default)")
	path := fs.String("path", metaserver.DefaultPath, "the path of the metadata (the connection string's path)")
	cert := fs.String("tls-cert", "", "serve https with this PEM certificate (and --tls-key)")
	key := fs.String("tls-key", "", "the PEM key of --tls-cert")
	var lim metaserver.Limits
	fs.IntVar(&lim.MaxKeys, "max-keys", metaserver.DefaultMaxKeys, "keys held at most; a PUT of a new key past it is refused (507)")
	fs.IntVar(&lim.MaxValue, "max-value", metaserver.DefaultMaxValue, "bytes of one value at most (413 past it)")
	fs.Int64Var(&lim.MaxBytes, "max-bytes", metaserver.DefaultMaxBytes, "bytes of all keys and values at most (507 past it)")
	fs.DurationVar(&lim.MaxTTL, "max-ttl", metaserver.DefaultMaxTTL, "the longest TTL a PUT may ask for (header "+metaserver.TTLHeader+", seconds)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var bad []string
	if (*cert == "") != (*key == "") {
		bad = append(bad, "--tls-cert and --tls-key: give both or neither")
	}
	if lim.MaxKeys < 1 || lim.MaxValue < 1 || lim.MaxBytes < 1 || lim.MaxTTL < time.Second {
		bad = append(bad, "--max-keys, --max-value, --max-bytes: at least 1; --max-ttl: at least 1s")
	}
	if len(bad) > 0 {
		return usageError(fs, bad...)
	}
	srv, err := metaserver.New(*path, lim, nil)
	if err != nil {
		return usageError(fs, err.Error())
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("metadata-server: listen %s: %w", *listen, err)
	}
	scheme := "http"
	if *cert != "" {
		pair, err := tls.LoadX509KeyPair(*cert, *key)
		if err != nil {
			ln.Close()
			return fmt.Errorf("metadata-server: --tls-cert/--tls-key: %w", err)
		}
		ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12})
		scheme = "https"
	}
	fmt.Fprintf(stdout, "metadata server on %s://%s%s (MC_METADATA_SERVER=%s://<this host>:%s%s)\n", scheme, ln.Addr(), *path,
		scheme, listenPort(ln.Addr().String()), *path)
	return srv.Serve(ctx, ln)
}

