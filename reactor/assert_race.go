//go:build race

package reactor

// assertLoop turns the loop-only assertions on: race builds (every test run) check that a
// loop-only call really runs on the loop.
const assertLoop = true
