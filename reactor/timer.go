package reactor

import "time"

// Timer is a one-shot timer on the loop, made by AfterFunc. Its methods are loop only.
type Timer struct {
	l    *Loop
	f    func()
	when int64 // deadline, ns since l.base
	seq  uint64
	idx  int // position in the heap; -1 when not pending
}

// AfterFunc runs f on the loop once d has passed (d <= 0: on the next iteration). The loop's
// blocking epoll_wait takes the next deadline as its timeout. Loop only: it panics elsewhere.
func (l *Loop) AfterFunc(d time.Duration, f func()) *Timer {
	if !l.OnLoop() {
		panic(ErrNotInLoop)
	}
	if f == nil {
		panic("reactor: AfterFunc: f must not be nil")
	}
	t := &Timer{l: l, f: f, idx: -1}
	l.schedule(t, d)
	return t
}

// Reset (re)starts the timer to fire once d from now, whether it was pending, fired or
// stopped. Loop only: it panics elsewhere.
func (t *Timer) Reset(d time.Duration) {
	if !t.l.OnLoop() {
		panic(ErrNotInLoop)
	}
	t.l.schedule(t, d)
}

// Stop cancels the timer; it reports whether the timer was pending. Loop only: it panics
// elsewhere.
func (t *Timer) Stop() bool {
	if !t.l.OnLoop() {
		panic(ErrNotInLoop)
	}
	if t.idx < 0 {
		return false
	}
	t.l.timers.remove(t.idx)
	return true
}

func (l *Loop) schedule(t *Timer, d time.Duration) {
	when := l.mono() + int64(d)
	// Never due in the pass that sets it: a timer re-armed with d <= 0 from its own callback
	// runs on the next iteration instead of looping forever.
	if minWhen := l.now.Load() + 1; when < minWhen {
		when = minWhen
	}
	l.timerSeq++
	t.when, t.seq = when, l.timerSeq
	if t.idx >= 0 {
		l.timers.fix(t.idx)
	} else {
		l.timers.push(t)
	}
}

func (l *Loop) runTimers(now int64) {
	for len(l.timers) > 0 && l.timers[0].when <= now {
		t := l.timers[0]
		l.timers.remove(0)
		l.st.timerEvents.Add(1)
		t.f()
		l.endCallback("timer", 0)
	}
}

// timerHeap is a binary min-heap by (when, seq); each timer knows its index.
type timerHeap []*Timer

func (h timerHeap) less(i, j int) bool {
	if h[i].when != h[j].when {
		return h[i].when < h[j].when
	}
	return h[i].seq < h[j].seq
}

func (h timerHeap) swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx = i
	h[j].idx = j
}

func (h timerHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h timerHeap) down(i int) bool {
	start := i
	n := len(h)
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if r := c + 1; r < n && h.less(r, c) {
			c = r
		}
		if !h.less(c, i) {
			break
		}
		h.swap(i, c)
		i = c
	}
	return i > start
}

func (h *timerHeap) push(t *Timer) {
	t.idx = len(*h)
	*h = append(*h, t)
	h.up(t.idx)
}

func (h *timerHeap) remove(i int) {
	old := *h
	last := len(old) - 1
	t := old[i]
	if i != last {
		old.swap(i, last)
	}
	old[last] = nil
	*h = old[:last]
	if i != last {
		h.fix(i)
	}
	t.idx = -1
}

func (h timerHeap) fix(i int) {
	if !h.down(i) {
		h.up(i)
	}
}
