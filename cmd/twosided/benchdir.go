package main

import (
	"context"
	"encoding/json"
	"flag"
	"io"
	"os"

	"github.com/twosided/twosided/bench"
)

func init() {
	register(&command{
		Name: "bench-directory",
		Summary: "Fan-in from sender processes registered in a metadata service to one receiver, by server\n" +
			"name and by host:port, and the resolve cost (cached, uncached). Needs etcd, Redis or an HTTP\n" +
			"metadata server: --metadata etcd://host:2379, redis://host:6379 or http://host:8080/metadata.",
		Usage: "--metadata etcd://h:2379|redis://h:6379|http://h:8080/metadata [--senders 16] [-n count] [-s size] [--transport t] [--cluster-id id] [--json file]",
		Run:   runBenchDirectory,
	})
}

func runBenchDirectory(ctx context.Context, fs *flag.FlagSet, args []string, stdout io.Writer) error {
	bench.ChildMain() // the senders re-execute "twosided bench-directory"
	var cfg bench.DirectoryConfig
	fs.StringVar(&cfg.Metadata, "metadata", os.Getenv("MC_METADATA_SERVER"), "metadata service to register in: etcd://, redis:// or http:// (default MC_METADATA_SERVER)")
	fs.StringVar(&cfg.ClusterID, "cluster-id", "", "keys under mooncake/<id>/rpc_meta/ (default twosided-bench)")
	fs.StringVar(&cfg.Transport, "transport", "", "oob or rdma_twosided (default rdma_twosided)")
	fs.IntVar(&cfg.Senders, "senders", 0, "sender processes (default 16)")
	fs.IntVar(&cfg.Count, "n", 0, "notifies per sender per pass (default 2000)")
	fs.IntVar(&cfg.Size, "s", 0, "message bytes (default 64)")
	jsonPath := fs.String("json", "", "write the figures to this file")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg.ChildArgs = []string{"bench-directory"}
	rep, err := bench.RunDirectory(ctx, cfg, stdout)
	if err != nil {
		return err
	}
	if *jsonPath != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		return os.WriteFile(*jsonPath, append(b, '\n'), 0o644)
	}
	return nil
}
