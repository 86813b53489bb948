package bench

import (
	"time"

	"golang.org/x/sys/unix"
)

// epoch is the origin of nanotime; time.Since reads the monotonic clock and allocates
// nothing.
var epoch = time.Now()

// nanotime is monotonic nanoseconds since the package was loaded, comparable only within
// this process.
func nanotime() int64 { return int64(time.Since(epoch)) }

// cpuTime is the user plus system CPU time of this process (getrusage RUSAGE_SELF).
func cpuTime() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
