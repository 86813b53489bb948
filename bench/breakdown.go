package bench

import (
	"golang.org/x/sys/unix"
)

// Where the time of a notify goes, measured in the two-process latency scenario with an
// echo. Both processes stamp with CLOCK_MONOTONIC, one clock for the whole host: the sender
// before SendNotify, the receiver in its handler (the stamp travels back in the echo's
// message, after the sequence number), the sender's handler when the echo arrives, the
// sender when SendNotify returns and when its goroutine resumes after the echo.

// Hop is one measured stretch of a notify's round trip.
type Hop struct {
	Name string  `json:"name"`
	What string  `json:"what"`
	P50  float64 `json:"p50_us"`
	P90  float64 `json:"p90_us"`
}

// Breakdown is the per-hop view of a latency run, with the reactor wake-ups per notify of
// each process.
type Breakdown struct {
	Hops                []Hop   `json:"hops"`
	SenderWakeupsPerN   float64 `json:"sender_wakeups_per_notify"`
	ReceiverWakeupsPerN float64 `json:"receiver_wakeups_per_notify"`
}

// stampLen is the receiver's stamp after the sequence number in an echo.
const stampLen = 16

// monoNow is CLOCK_MONOTONIC in nanoseconds: comparable across the processes of one host.
// unix.ClockGettime is a system call; nanotime reads the same clock through the vDSO, so the
// offset between them is taken once and every stamp costs no system call.
func monoNow() int64 { return nanotime() + monoOffset }

// monoOffset is CLOCK_MONOTONIC minus nanotime, from the tightest of 32 bracketed samples: a
// sample taken across a preemption would shift every stamp of this process.
var monoOffset = func() int64 {
	var best, off int64 = -1, 0
	for range 32 {
		var ts unix.Timespec
		t1 := nanotime()
		if unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) != nil {
			return 0
		}
		t2 := nanotime()
		if w := t2 - t1; best < 0 || w < best {
			best, off = w, ts.Nano()-(t1+t2)/2
		}
	}
	return off
}()

// stamps are the per-sequence times of a breakdown run.
type stamps struct {
	send, ret, resume []int64 // sender: before SendNotify, after it, after the echo wait
}

func newStamps(n int) *stamps {
	return &stamps{send: make([]int64, n), ret: make([]int64, n), resume: make([]int64, n)}
}

// breakdown computes the hops of sequence numbers [from, len) from the sender's stamps and
// the sink's (the receiver's handler stamp, the echo's arrival).
func (st *stamps) breakdown(s *sink, from int) []Hop {
	names := []struct{ name, what string }{
		{"submit→peer handler", "sender's post in a borrowed turn (or a loop wake-up), wire, receiver wake-up, CQ, handler"},
		{"peer handler→SendNotify returns", "receiver's ACK, sender wake-up (the caller waiting as the loop, or the loop then the caller), CQ, completion"},
		{"peer handler→echo handler", "reply posted in the receiver's turn, wire, sender wake-up, CQ, handler"},
		{"echo handler→caller resumes", "the rest of the sender's turn (the ACK of the echo written), or the hand-off to the waiting goroutine"},
	}
	hs := make([]*Hist, len(names))
	for i := range hs {
		hs[i] = NewHist()
	}
	for i := from; i < len(st.send); i++ {
		peer, echo := s.peerAt[i].Load(), s.echoAt[i].Load()
		if st.send[i] == 0 || st.ret[i] == 0 || st.resume[i] == 0 || peer == 0 || echo == 0 {
			continue
		}
		hs[0].Record(peer - st.send[i])
		hs[1].Record(st.ret[i] - peer)
		hs[2].Record(echo - peer)
		hs[3].Record(st.resume[i] - echo)
	}
	out := make([]Hop, 0, len(names))
	for i, n := range names {
		sm := hs[i].Summary(1)
		if sm == nil {
			return nil
		}
		out = append(out, Hop{Name: n.name, What: n.what, P50: sm.P50, P90: sm.P90})
	}
	return out
}
