//go:build !race

package reactor

// assertLoop: without the race detector the loop-only assertions are off (a loop-only
// method called from elsewhere is a bug every race-enabled test run would find).
const assertLoop = false
