package notify

import (
	"os"
	"runtime"
	"sync"

	"github.com/rs/zerolog"
)

var procsMu sync.Mutex

// reserveProcs raises GOMAXPROCS to NumCPU+2 when an engine starts, unless the user set the
// GOMAXPROCS variable.
//
// Why: the reactor and the soft provider's NIC run on locked OS threads that block in
// epoll_wait and read(2). A thread in a syscall keeps its P until the runtime's sysmon
// retakes it, 20 µs to 10 ms later, and a goroutine the reactor readies (a SendNotify caller,
// a Recv waiter) sits in that P's run queue meanwhile. With GOMAXPROCS = NumCPU = 2 every P
// is often held so, and each hand-off to a goroutine waits for sysmon. Two spare Ps let the
// runtime start the readied goroutine at once; measured on a 2-vCPU VM, sequential
// rdma_twosided notifies went from ~180 µs to ~55 µs (BenchmarkSendNotify, GOMAXPROCS 2
// vs 4). Spare Ps cost nothing while idle.
func reserveProcs(log zerolog.Logger) {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	procsMu.Lock()
	defer procsMu.Unlock()
	want := runtime.NumCPU() + 2
	if have := runtime.GOMAXPROCS(0); have < want {
		runtime.GOMAXPROCS(want)
		log.Debug().Int("from", have).Int("to", want).Msg("raised GOMAXPROCS for the reactor's blocking threads")
	}
}
