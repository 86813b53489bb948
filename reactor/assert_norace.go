//go:build !race

package reactor

// assertLoop: without the race detector the loop-only assertions are off; each would cost
// a gettid system call on the per-notify path (12% of CPU in BenchmarkSendNotifyAsync).
const assertLoop = false
