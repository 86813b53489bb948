package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/twosided/twosided/ibv"
)

func init() {
	register(&command{
		Name:    "version",
		Summary: "Print the module version, commit, Go version, build tags, the RDMA providers compiled in and whether libibverbs loaded.",
		Usage:   "",
		Run:     runVersion,
	})
}

func runVersion(_ context.Context, fs *flag.FlagSet, args []string, stdout io.Writer) error {
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = &debug.BuildInfo{GoVersion: runtime.Version()}
	}
	lines := append(versionLines(bi, providerNames()), providerStatusLines(ibv.Providers())...)
	for _, l := range lines {
		fmt.Fprintln(stdout, l)
	}
	return nil
}

// libraryProvider is a provider that loads a shared library at its first use: the verbs
// provider, which dlopens libibverbs (ibv/verbs, Provider.Library). Library says where the
// library was loaded from, or why it could not be.
type libraryProvider interface {
	Library() (path string, err error)
}

// providerStatusLines say, per provider, whether it was compiled in and, for one that loads
// a library, whether that loaded: "verbs:     compiled in, libibverbs loaded from PATH",
// "verbs:     compiled in, libibverbs not loaded: WHY", or, without -tags rdma,
// "verbs:     not compiled in (build with -tags rdma)". Asking loads the library.
func providerStatusLines(providers []ibv.Provider) []string {
	var lines []string
	haveVerbs := false
	for _, p := range providers {
		haveVerbs = haveVerbs || p.Name() == verbsProvider
		lines = append(lines, fmt.Sprintf("%-11s%s", p.Name()+":", providerStatus(p)))
	}
	if !haveVerbs {
		lines = append(lines, fmt.Sprintf("%-11s%s", verbsProvider+":", "not compiled in (build with -tags rdma)"))
	}
	return lines
}

// providerStatus is one provider's status, after its name.
func providerStatus(p ibv.Provider) string {
	lp, ok := p.(libraryProvider)
	switch {
	case ok:
		path, err := lp.Library()
		if err != nil {
			return "compiled in, " + err.Error()
		}
		return "compiled in, libibverbs loaded from " + path
	case p.Name() == "soft":
		return "compiled in (RC over TCP, pure Go: needs no library)"
	}
	return "compiled in"
}

// providerNames are the ibv providers registered in this binary ("soft" always; "verbs"
// with -tags rdma).
func providerNames() []string {
	var names []string
	for _, p := range ibv.Providers() {
		names = append(names, p.Name())
	}
	return names
}

// versionLines describes the build: what `go version -m` would say of the module, and the
// providers.
func versionLines(bi *debug.BuildInfo, providers []string) []string {
	version := bi.Main.Version
	switch version {
	case "":
		version = "unknown"
	case "(devel)":
		version = "(devel): built from a checkout, not installed at a version"
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	commit := "unknown (no VCS stamp: built with -buildvcs=false, or not in a git checkout)"
	if rev := settings["vcs.revision"]; rev != "" {
		commit = rev
		if t := settings["vcs.time"]; t != "" {
			commit += " (" + t + ")"
		}
		if settings["vcs.modified"] == "true" {
			commit += ", with local changes"
		}
	}
	tags := settings["-tags"]
	if tags == "" {
		tags = "none"
	}
	if len(providers) == 0 {
		providers = []string{"none"}
	}
	path := bi.Main.Path
	if path == "" {
		path = "github.com/twosided/twosided"
	}
	return []string{
		"twosided " + version,
		"module:    " + path,
		"commit:    " + commit,
		"go:        " + bi.GoVersion + " " + runtime.GOOS + "/" + runtime.GOARCH,
		"tags:      " + tags,
		"providers: " + strings.Join(providers, ", ") + providerNote(providers),
	}
}

// providerNote says how to get the libibverbs provider when it is missing.
func providerNote(providers []string) string {
	for _, p := range providers {
		if p == "verbs" {
			return ""
		}
	}
	return " (build with -tags rdma for the libibverbs provider)"
}
