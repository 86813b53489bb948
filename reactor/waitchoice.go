package reactor

// waitChoice decides where ExecWait's caller waits: on the callers' set (nothing set up
// for the wait, but every event that comes while the caller is not in epoll_wait, busy with
// an earlier one, wakes the loop thread, which then disarms its set and has the turn give
// the disarm back: a wake-up and two epoll_ctl) or on the loop's own set disarmed in the
// outer one for the whole wait (two epoll_ctl every time). Which costs less depends on the
// traffic: one answer per wait (a notify and its ACK) rarely finds the caller busy (about
// one wait in eight, the answer beating the wait's start), while an answer that comes with
// a second event close behind (the peer's echo, then the ACK) does so in about half the
// waits, and then the disarm costs less. So it keeps the share of waits on the callers' set
// that woke the loop (an average over the last 16 or so) and, above 3 in 10, waits on the
// loop's set, trying the callers' set again every 16th wait to follow the traffic. Loop
// state: read and written in the turn only.
type waitChoice struct {
	rate  uint32 // waits on the callers' set that woke the loop: moving average, in 1/65536
	since uint32 // waits on the loop's set since the last one on the callers' set
}

const (
	choiceOne   = 1 << 16
	choiceShift = 4                  // weight of a new sample: 1/16
	choiceBound = choiceOne * 3 / 10 // share above which the loop's set is used
	choiceProbe = 16                 // every 16th wait then is on the callers' set
)

// onCallers reports whether the next wait is on the callers' set.
func (c *waitChoice) onCallers() bool {
	if c.rate <= choiceBound {
		return true
	}
	c.since++
	if c.since < choiceProbe {
		return false
	}
	c.since = 0
	return true
}

// record adds a wait on the callers' set: woke reports whether the loop thread woke for
// one of its events while the caller held the turn.
func (c *waitChoice) record(woke bool) {
	c.rate -= c.rate >> choiceShift
	if woke {
		c.rate += choiceOne >> choiceShift
	}
}
