package bench

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/twosided/twosided/internal/tracepoint"
)

// TracepointsEnv names the directory where a binary built with -tags tracepoints writes
// its stamps when a bench run ends: parent.PID (the sending side) and child.PID (the
// receiving side of a two-process run). `go run ./bench/segments DIR` prints where the
// time went. Run one transport and the latency scenario: the stamps of every run of the
// process go into one file.
const TracepointsEnv = "TWOSIDED_TRACEPOINTS"

// DumpTracepoints writes this process's stamps to $TWOSIDED_TRACEPOINTS/role.PID in a
// tracepoints build when the variable is set; otherwise it does nothing.
func DumpTracepoints(role string) error {
	dir := os.Getenv(TracepointsEnv)
	if !tracepoint.Enabled || dir == "" {
		return nil
	}
	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%s.%d", role, os.Getpid())))
	if err != nil {
		return fmt.Errorf("bench: %s: %w", TracepointsEnv, err)
	}
	if err := tracepoint.Dump(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("bench: %s: %w", TracepointsEnv, err)
	}
	return f.Close()
}
