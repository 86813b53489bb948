package main

import (
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progress is a progress bar on stderr for long work (github.com/schollz/progressbar/v3),
// shown only when stderr is a terminal and stdout does not already print a line per step
// to the same screen; otherwise every method does nothing. It never writes to stdout.
type progress struct {
	bar *progressbar.ProgressBar
}

// newProgress returns the bar of total steps of what; perStepOut says stdout prints a line
// per step (then a terminal stdout is its own progress).
func newProgress(stdout, stderr io.Writer, total int, what string, perStepOut bool) *progress {
	if total < 2 || !isTerminalWriter(stderr) || (perStepOut && isTerminalWriter(stdout)) {
		return &progress{}
	}
	return &progress{bar: progressbar.NewOptions(total,
		progressbar.OptionSetWriter(stderr),
		progressbar.OptionSetDescription(what),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString("notifies"),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionSetPredictTime(true),
	)}
}

func (p *progress) add(n int) {
	if p.bar != nil {
		_ = p.bar.Add(n)
	}
}

// finish clears the bar; calling it again does nothing.
func (p *progress) finish() {
	if p.bar != nil {
		_ = p.bar.Finish()
		p.bar = nil
	}
}

func isTerminalWriter(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && isTerminal(f)
}
