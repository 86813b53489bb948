// Command twosided is the one binary of the project: it lists RDMA devices and runs the
// notify server, client and benchmarks. Each subcommand lives in its own file, registers
// itself in init with register, and parses its own flag.FlagSet; this file owns only the
// dispatch, the usage text and the process's signal context. It must not hold subcommand
// logic.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	// The soft provider is always built in: it is the RDMA device of machines without one.
	_ "github.com/twosided/twosided/ibv/soft"
)

// command is one subcommand.
type command struct {
	// Name is the word after "twosided".
	Name string
	// Summary is one line for the command list.
	Summary string
	// Usage is the argument synopsis after the name, e.g. "[--json] [--provider name]".
	Usage string
	// Run defines its flags on fs, parses args with fs.Parse and does the work, writing
	// results to stdout. fs reports parse errors and --help itself.
	Run func(ctx context.Context, fs *flag.FlagSet, args []string, stdout io.Writer) error
}

var commands = map[string]*command{}

// register adds a subcommand; a second one of the same name is a programming error.
func register(c *command) {
	if _, dup := commands[c.Name]; dup {
		panic("twosided: command " + c.Name + " registered twice")
	}
	commands[c.Name] = c
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run dispatches args to a subcommand and returns the exit status: 0 success, 1 failure,
// 2 usage error.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	name, rest := args[0], args[1:]
	switch name {
	case "-h", "-help", "--help", "help":
		if len(rest) > 0 {
			if c, ok := commands[rest[0]]; ok {
				// The command defines its flags, then prints them for --help.
				_ = c.Run(ctx, newFlagSet(c, stdout), []string{"--help"}, stdout)
				return 0
			}
		}
		usage(stdout)
		return 0
	case "-v", "-version", "--version":
		name = "version"
	}
	c, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "twosided: unknown command %q\nRun 'twosided --help' for the commands.\n", name)
		return 2
	}
	fs := newFlagSet(c, stderr)
	err := c.Run(ctx, fs, rest, stdout)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	}
	fmt.Fprintf(stderr, "twosided %s: %v\n", name, err)
	return 1
}

// errUsage marks a bad command line; the flag set has already said what is wrong.
var errUsage = errors.New("usage error")

func newFlagSet(c *command, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("twosided "+c.Name, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintf(out, "usage: twosided %s %s\n\n%s\n", c.Name, c.Usage, c.Summary)
		var n int
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n > 0 {
			fmt.Fprintf(out, "\nflags:\n")
			fs.PrintDefaults()
		}
	}
	return fs
}

// parseFlags parses a command's flags; no command takes positional arguments. --help
// prints the command's usage and flags and returns flag.ErrHelp; a bad flag or argument
// prints its error and one line pointing to --help (usageError), and returns errUsage.
func parseFlags(fs *flag.FlagSet, args []string) error {
	// The flag package prints the error and then the whole usage; keep only the error.
	out := fs.Output()
	var said bytes.Buffer
	fs.SetOutput(&said)
	err := fs.Parse(args)
	fs.SetOutput(out)
	switch {
	case errors.Is(err, flag.ErrHelp):
		_, _ = out.Write(said.Bytes())
		return err
	case err != nil:
		return usageError(fs, err.Error())
	case fs.NArg() > 0:
		return usageError(fs, fmt.Sprintf("unexpected arguments: %q", fs.Args()))
	}
	return nil
}

// usageError prints what is wrong with the command line and where the help is, and
// returns errUsage (exit status 2).
func usageError(fs *flag.FlagSet, what ...string) error {
	for _, w := range what {
		fmt.Fprintf(fs.Output(), "%s: %s\n", fs.Name(), w)
	}
	fmt.Fprintf(fs.Output(), "Run '%s --help' for usage.\n", fs.Name())
	return errUsage
}

func usage(out io.Writer) {
	fmt.Fprintf(out, "usage: twosided <command> [flags]\n\ncommands:\n")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		// A summary's further lines line up under its first.
		fmt.Fprintf(out, "  %-10s %s\n", n, strings.ReplaceAll(commands[n].Summary, "\n", "\n"+strings.Repeat(" ", 13)))
	}
	fmt.Fprintf(out, "\nRun 'twosided <command> --help' for a command's flags.\n")
}
