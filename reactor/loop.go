package reactor

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/petermattis/goid"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/twosided/twosided/internal/tracepoint"
)

// Events is a set of epoll event bits (EPOLLIN, EPOLLOUT, EPOLLERR, EPOLLHUP, EPOLLRDHUP).
type Events uint32

// Event bits, with x/sys/unix's values. Error and Hangup are reported whether asked or not
// (EPOLLRDHUP only when asked).
const (
	Readable Events = unix.EPOLLIN
	Writable Events = unix.EPOLLOUT
	Error    Events = unix.EPOLLERR
	Hangup   Events = unix.EPOLLHUP | unix.EPOLLRDHUP
)

// Handler gets the ready events of one fd; called on the loop goroutine.
type Handler func(ev Events)

// Errors; callers test them with errors.Is.
var (
	// ErrQueueFull: the submission queue has no room; Submit does not wait (SubmitWait does).
	ErrQueueFull = errors.New("reactor: submission queue full")
	// ErrStopped: Stop was called; nothing more is accepted.
	ErrStopped = errors.New("reactor: stopped")
	// ErrNotInLoop: a loop-only method was called from another goroutine.
	ErrNotInLoop = errors.New("reactor: not on the loop goroutine")
	// ErrInvalid: a bad argument; the wrapping message names the field and the reason.
	ErrInvalid = errors.New("reactor: invalid argument")
	// ErrRegistered: the fd or CQ is already registered with the loop.
	ErrRegistered = errors.New("reactor: already registered")
	// ErrNotRegistered: the fd is not registered with Add.
	ErrNotRegistered = errors.New("reactor: not registered")
	// ErrClosed: the CQWatch was closed already.
	ErrClosed = errors.New("reactor: closed")
)

// Limits of the options.
const (
	DefaultSubmitQueue  = 4096
	MaxSubmitQueue      = 1 << 24
	DefaultSlowCallback = 10 * time.Millisecond
	DefaultCQBatch      = 32
	MaxCQBatch          = 4096
	maxEpollEvents      = 128
)

type config struct {
	busyPoll    time.Duration
	submitQueue int
	slow        time.Duration
	cqBatch     int
	log         *zerolog.Logger
}

// Option configures New.
type Option func(*config)

// WithBusyPoll makes the loop spin up to budget after its last piece of work before it blocks
// (epoll_wait with timeout 0 and the watched CQs polled directly). 0, the default, never spins.
func WithBusyPoll(budget time.Duration) Option { return func(c *config) { c.busyPoll = budget } }

// WithSubmitQueue sets the capacity of the submission queue (default 4096, 1..1<<24).
func WithSubmitQueue(n int) Option { return func(c *config) { c.submitQueue = n } }

// WithSlowCallback logs, at warn level, every callback that runs longer than d (default
// 10ms); 0 turns the log off (Stats.LongestCallback is kept either way).
func WithSlowCallback(d time.Duration) Option { return func(c *config) { c.slow = d } }

// WithLogger sets the logger (default: JSON to stderr). The loop logs only slow callbacks and
// CQ errors that no CQErrorHandler takes.
func WithLogger(l zerolog.Logger) Option { return func(c *config) { c.log = &l } }

// WithCQBatch sets how many WCs one Poll of a watched CQ asks for (default 32, 1..4096).
func WithCQBatch(n int) Option { return func(c *config) { c.cqBatch = n } }

// Stats are the loop's counters since New.
type Stats struct {
	Iterations      uint64        // loop iterations
	Wakeups         uint64        // returns from a blocking epoll_wait (events or timeout)
	Interrupts      uint64        // blocking epoll_waits cut short by a signal (EINTR)
	BusyPolls       uint64        // busy-poll rounds (0 unless WithBusyPoll)
	FdEvents        uint64        // events handed to Add handlers
	CQEvents        uint64        // completion-channel events got with GetEvent
	WCs             uint64        // work completions handed to CQHandlers
	TimerEvents     uint64        // timers fired
	SubmitEvents    uint64        // wake-ups through the submission eventfd
	Submissions     uint64        // submitted funcs run (Exec's included)
	Borrowed        uint64        // turns run on a caller's thread while the loop slept (Exec, ExecWait, Poll)
	LeftToCaller    uint64        // loop wake-ups for its own set while a caller held the turn: left to the caller
	TakenOver       uint64        // of those, ones the caller could not see (an fd outside the callers' set): its wait ended
	QueueFull       uint64        // submissions refused with ErrQueueFull
	SlowCallbacks   uint64        // callbacks over the WithSlowCallback threshold
	LongestCallback time.Duration // longest single callback (handler, timer, func, CQ cycle)
	Busy            time.Duration // time spent in iterations, outside epoll_wait and busy-polling
}

type counters struct {
	iterations, wakeups, interrupts, busyPolls      atomic.Uint64
	fdEvents, cqEvents, wcs, timerEvents            atomic.Uint64
	submitEvents, submissions, queueFull, slowCalls atomic.Uint64
	borrowed, leftToCaller, takenOver               atomic.Uint64
	longest, busy                                   atomic.Int64
}

const (
	awake  int32 = 0
	asleep int32 = 1
)

var wakeOne = [8]byte{1} // an eventfd add of 1, host order (any non-zero value wakes)

// Loop is one event loop: one goroutine on one locked OS thread, one epoll set.
type Loop struct {
	cfg  config
	log  zerolog.Logger
	epfd int
	wfd  int // wake-up eventfd
	// outer is the set the loop blocks on while callers wait as the loop (ExecWait) or poll
	// (busy poll): wfd and epfd. A spinning caller disarms epfd there, so that the kernel does
	// not wake the loop for its events, as does an ExecWait while a draining fd is outside
	// the callers' set; the loop itself disarms it when it leaves events to a turn's holder.
	// Otherwise the loop blocks on epfd itself (one epoll_wait per wake-up).
	outer int // -1 once closed (under holdMu)
	// callers is the set an ExecWait caller blocks on: the wake-up eventfd and every fd whose
	// handler drains (AddDrained, completion channels), each added there before the loop's
	// set and exclusively, so that its events wake the waiting caller alone (see "Callers'
	// set" in the package doc).
	callers int
	base    time.Time
	done    chan struct{}

	// Shared with other goroutines.
	q       *ring
	state   atomic.Int32 // awake or asleep: whether a producer must write the eventfd
	mu      sync.RWMutex // Submit holds it shared; Stop and the loop's final barrier exclusively
	stopped atomic.Bool
	gid     atomic.Int64 // the loop goroutine's id; 0 before start and after exit
	now     atomic.Int64 // ns since base, read once per iteration
	waiters atomic.Int32 // SubmitWait callers waiting for room
	holds   atomic.Int32 // HoldSpin callers: while > 0 the loop blocks instead of spinning
	// released is when the last HoldSpin ended (ns since base): a loop whose caller spun
	// within the budget blocks instead of spinning, leaving its turn to the caller's Exec.
	released atomic.Int64
	// waitTurnAt is when an ExecWait's wait last began (ns since base; 0: never).
	waitTurnAt atomic.Int64
	holdMu     sync.Mutex // orders HoldSpin, ReleaseSpin and ExecWait's arming of the outer set
	blinds     int        // callers watching the loop's set for it (blind); holdMu
	// loopBlind: the loop disarmed its own set in the outer one for the caller holding the
	// turn (waitOuter); given back by that caller's endBorrow or unblind, or by the loop
	// once it holds the turn. Written under holdMu.
	loopBlind atomic.Bool
	// holdBlind: the spin holders' watch is taken (one blind for all of them, by the first
	// Poll of a holder, given back by the last ReleaseSpin); written under holdMu.
	holdBlind atomic.Bool
	// onCallers: the turn's holder is an ExecWait that waits on the callers' set (it sees
	// only the fds there); set and cleared by that holder, read by the loop in waitOuter.
	onCallers atomic.Bool
	// turn is the right to run loop work: the loop goroutine holds it except while it blocks
	// in epoll_wait, when Exec may borrow it (TryLock only: a borrower never waits for it).
	turn     sync.Mutex
	borrower atomic.Int64 // the id of the goroutine running a borrowed turn; 0 when none
	roomMu   sync.Mutex
	room     chan struct{} // closed by the loop when it frees room and waiters > 0
	st       counters

	// Loop only.
	fds      fdTable
	unpaired int        // draining fds in the loop's set alone (arm): ExecWait disarms instead
	choice   waitChoice // where ExecWait's caller waits
	gen      uint32
	events   []unix.EpollEvent
	pevents  []unix.EpollEvent // Poll's: the loop thread may be filling events meanwhile
	obuf     [2]unix.EpollEvent
	timers   timerHeap
	timerSeq uint64
	chans    map[int]*chanWatch
	watches  []*CQWatch
	watchGen uint64
	kicks    []*CQWatch
	deferArm bool // busy-poll mode between blocks: CQs are armed only right before blocking
	// sleepUntil is the deadline (ns since base) of the blocking epoll_wait the loop is in;
	// math.MaxInt64 without one. A borrowed turn that sets an earlier timer wakes the loop.
	sleepUntil int64
	cbStart    int64
	longest    int64
	wakeBuf    [8]byte
}

type fdKind uint8

const (
	kindWake fdKind = iota
	kindUser
	kindChannel
)

type fdEntry struct {
	kind fdKind
	gen  uint32 // travels in the epoll data, so a stale event never reaches a new owner of fd
	ev   Events
	h    Handler
	cw   *chanWatch
	// drained: the handler drains (AddDrained, a completion channel); paired: the fd is in
	// the callers' set too; lost: a failed Modify left it in neither set.
	drained, paired, lost bool
}

// New creates a loop and starts its goroutine (locked to its OS thread) immediately.
func New(opts ...Option) (*Loop, error) {
	cfg := config{submitQueue: DefaultSubmitQueue, slow: DefaultSlowCallback, cqBatch: DefaultCQBatch}
	for _, o := range opts {
		o(&cfg)
	}
	switch {
	case cfg.busyPoll < 0:
		return nil, fmt.Errorf("reactor: busy poll %v: must not be negative: %w", cfg.busyPoll, ErrInvalid)
	case cfg.submitQueue < 1 || cfg.submitQueue > MaxSubmitQueue:
		return nil, fmt.Errorf("reactor: submit queue %d: must be between 1 and %d: %w", cfg.submitQueue, MaxSubmitQueue, ErrInvalid)
	case cfg.slow < 0:
		return nil, fmt.Errorf("reactor: slow callback %v: must not be negative: %w", cfg.slow, ErrInvalid)
	case cfg.cqBatch < 1 || cfg.cqBatch > MaxCQBatch:
		return nil, fmt.Errorf("reactor: cq batch %d: must be between 1 and %d: %w", cfg.cqBatch, MaxCQBatch, ErrInvalid)
	}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("reactor: epoll_create1: %w", err)
	}
	callers, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		_ = unix.Close(epfd)
		return nil, fmt.Errorf("reactor: epoll_create1: %w", err)
	}
	wfd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		_ = unix.Close(epfd)
		_ = unix.Close(callers)
		return nil, fmt.Errorf("reactor: eventfd: %w", err)
	}
	l := &Loop{
		cfg:     cfg,
		epfd:    epfd,
		callers: callers,
		wfd:     wfd,
		base:    time.Now(),
		done:    make(chan struct{}),
		q:       newRing(cfg.submitQueue),
		room:    make(chan struct{}),
		events:  make([]unix.EpollEvent, maxEpollEvents),
		pevents: make([]unix.EpollEvent, maxEpollEvents),
		chans:   make(map[int]*chanWatch),
	}
	if cfg.log != nil {
		l.log = *cfg.log
	} else {
		l.log = zerolog.New(os.Stderr).With().Timestamp().Logger()
	}
	l.deferArm = cfg.busyPoll > 0
	// The eventfd wakes a caller waiting in the callers' set as well as the loop: a
	// submission or Stop ends that wait (the loop takes over). Marked seen in the loop's set.
	l.gen = 1
	l.fds.set(wfd, &fdEntry{kind: kindWake, gen: l.gen, ev: Readable})
	data := l.gen | seenBit
	we := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(wfd), Pad: int32(data)}
	err = unix.EpollCtl(callers, unix.EPOLL_CTL_ADD, wfd, &we)
	if err == nil {
		err = unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wfd, &we)
	}
	if err == nil {
		l.outer, err = newOuterSet(wfd, epfd)
	}
	if err != nil {
		_ = unix.Close(wfd)
		_ = unix.Close(epfd)
		_ = unix.Close(callers)
		return nil, fmt.Errorf("reactor: set up the wake-up eventfd: %w", err)
	}
	go l.run()
	return l, nil
}

func (l *Loop) mono() int64 { return int64(time.Since(l.base)) }

// Now is the loop's clock: monotonic time read once per loop iteration. Safe from any
// goroutine.
func (l *Loop) Now() time.Time { return l.base.Add(time.Duration(l.now.Load())) }

// InLoop reports whether the caller runs on the loop goroutine, or is the goroutine that
// borrowed the loop's turn in Exec. The answer compares goroutine ids (read from the
// runtime's goroutine record, a load, not a system call: a turn's identity is asked several
// times per notify).
func (l *Loop) InLoop() bool {
	gid := l.gid.Load()
	if gid == 0 {
		return false
	}
	me := goid.Get()
	return me == gid || me == l.borrower.Load()
}

// OnLoop is the loop-only assertion: InLoop in race builds (every test run), true without
// one, where the check would cost a system call per call. Use InLoop where the answer
// decides what to do; use OnLoop to guard loop-only entry points.
func (l *Loop) OnLoop() bool { return !assertLoop || l.InLoop() }

// Stats returns the loop's counters. Safe from any goroutine.
func (l *Loop) Stats() Stats {
	return Stats{
		Iterations:      l.st.iterations.Load(),
		Wakeups:         l.st.wakeups.Load(),
		Interrupts:      l.st.interrupts.Load(),
		BusyPolls:       l.st.busyPolls.Load(),
		FdEvents:        l.st.fdEvents.Load(),
		CQEvents:        l.st.cqEvents.Load(),
		WCs:             l.st.wcs.Load(),
		TimerEvents:     l.st.timerEvents.Load(),
		SubmitEvents:    l.st.submitEvents.Load(),
		Submissions:     l.st.submissions.Load(),
		Borrowed:        l.st.borrowed.Load(),
		LeftToCaller:    l.st.leftToCaller.Load(),
		TakenOver:       l.st.takenOver.Load(),
		QueueFull:       l.st.queueFull.Load(),
		SlowCallbacks:   l.st.slowCalls.Load(),
		LongestCallback: time.Duration(l.st.longest.Load()),
		Busy:            time.Duration(l.st.busy.Load()),
	}
}

// Stop stops the loop: it runs the funcs queued before Stop, closes every fd it owns (the
// fds given to Add and not removed, its eventfd and epoll fd; never a completion channel) and
// its goroutine exits. Stop waits for that, bounded by ctx. On the loop goroutine it only
// starts the stop, which completes when the current callback returns. Calling it again is
// harmless.
func (l *Loop) Stop(ctx context.Context) error {
	l.mu.Lock()
	if !l.stopped.Load() {
		l.stopped.Store(true)
		l.wake() // under the lock: the loop closes the eventfd only after taking it
	}
	l.mu.Unlock()
	if l.InLoop() {
		return nil
	}
	select {
	case <-l.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("reactor: stop: %w", ctx.Err())
	}
}

// Done is closed when the loop goroutine has exited.
func (l *Loop) Done() <-chan struct{} { return l.done }

func (l *Loop) wake() { _, _ = unix.Write(l.wfd, wakeOne[:]) }

func (l *Loop) run() {
	runtime.LockOSThread() // never unlocked: the thread ends with the loop
	l.turn.Lock()          // never unlocked after shutdown: no Exec borrows a stopped loop
	l.gid.Store(goid.Get())
	n := 0
	for {
		l.st.iterations.Add(1)
		now := l.mono()
		l.now.Store(now)
		l.cbStart = now
		l.dispatch(l.events[:n], false)
		l.runQueue()
		l.runTimers(now)
		l.runKicks()
		l.flushCQs()
		l.st.busy.Add(l.mono() - now)
		if l.stopped.Load() {
			break
		}
		n = l.wait()
	}
	l.shutdown()
}

// wait returns how many epoll events are ready in l.events (possibly 0).
func (l *Loop) wait() int {
	if l.cfg.busyPoll > 0 {
		// A caller of this loop that spins holds it (one spinner per process).
		if !l.callerPolls() {
			if n, work := l.spin(); work {
				return n
			}
		}
		l.armDeferred()
	}
	timeout := l.timeout()
	if timeout != 0 {
		// Publish "asleep", then look again: a producer that pushed before seeing it will not
		// write the eventfd, so the loop must see its func (sequentially consistent atomics).
		l.state.Store(asleep)
		if l.q.ready() || len(l.kicks) > 0 || l.stopped.Load() {
			timeout = 0
		}
	}
	if timeout != 0 {
		l.sleepUntil = math.MaxInt64
		if timeout > 0 {
			l.sleepUntil = l.timers[0].when
		}
		l.turn.Unlock() // Exec may run a turn on its caller's thread while the loop sleeps
	}
	var n int
	var err error
	haveTurn := false
	if timeout != 0 && (l.cfg.busyPoll > 0 || l.waitedLately() || testOuterAlways.Load()) {
		// Callers may poll or wait as the loop (Poll, ExecWait): block on the outer set,
		// where such a caller disarms the loop's own set, then take the events from the latter.
		n, haveTurn, err = l.waitOuter(timeout)
	} else {
		tracepoint.Mark(tracepoint.SleepLoop, timeout)
		n, err = unix.EpollWait(l.epfd, l.events, timeout)
		tracepoint.Mark(tracepoint.LoopWoke, n)
	}
	l.state.Store(awake)
	if timeout != 0 && !haveTurn {
		l.turn.Lock() // waits out a borrowed turn; the events got stay valid (fd generations)
	}
	if l.loopBlind.Load() {
		l.holdMu.Lock()
		l.giveBackLoopBlind() // the loop watches its own set again, through the outer one
		l.holdMu.Unlock()
	}
	if l.cfg.busyPoll > 0 {
		l.deferArm = true
	}
	if err != nil {
		if err == unix.EINTR {
			l.st.interrupts.Add(1)
		} else {
			l.log.Error().Err(err).Msg("reactor: epoll_wait")
		}
		return 0
	}
	if timeout != 0 {
		l.st.wakeups.Add(1)
	}
	return n
}

// waitOuter blocks on the outer set for at most timeout ms (the loop's deadline,
// sleepUntil), then takes the ready events of the loop's own set. haveTurn: it took the
// turn (free when the loop's set became ready).
//
// When the loop's set becomes ready while a caller holds the turn (its answer came before
// it waited, its thread being still in its send; or it runs an Exec or Poll turn), the loop
// leaves the events to it instead of waking for the turn: it disarms its set in the outer
// one for the caller (loopBlind) and sleeps on. Otherwise it would wait for the turn and,
// being awake, end a caller's wait as the loop (ExecWait), which then hands its result over
// through its Waiter: two more thread wake-ups. The turn's holder gives the disarm back
// when its turn ends (endBorrow, unblind), so what it left in the set wakes the loop then.
// A caller waiting on the callers' set sees only the fds in it: an event of another fd is
// not left to it; the loop ends its wait (the eventfd) and takes the turn.
func (l *Loop) waitOuter(timeout int) (n int, haveTurn bool, err error) {
	for {
		var k int
		tracepoint.Mark(tracepoint.SleepOuter, timeout)
		if k, err = unix.EpollWait(l.outer, l.obuf[:], timeout); err != nil || k == 0 {
			return 0, false, err
		}
		own := true // only the loop's own set is ready: not the eventfd (a submission, Stop)
		for _, ev := range l.obuf[:k] {
			if int(ev.Fd) != l.epfd {
				own = false
			}
		}
		// The events go into the loop thread's own buffer; they stay valid through a turn
		// borrowed meanwhile (fd generations).
		n, err = unix.EpollWait(l.epfd, l.events, 0)
		tracepoint.Mark(tracepoint.LoopWoke, n)
		if err != nil || !own {
			return n, false, err
		}
		if n > 0 {
			l.holdMu.Lock()
			if l.turn.TryLock() {
				l.holdMu.Unlock()
				return n, true, nil
			}
			if l.onCallers.Load() && !callersSee(l.events[:n]) {
				l.holdMu.Unlock()
				l.st.takenOver.Add(1)
				l.wake() // the eventfd is in the callers' set
				return n, false, nil
			}
			if h := testHookLeaving.Load(); h != nil {
				(*h)()
			}
			if !l.loopBlind.Load() {
				l.loopBlind.Store(true)
				l.blind(+1)
			}
			l.holdMu.Unlock()
			l.st.leftToCaller.Add(1)
		}
		// Left to the turn's holder, or already taken by it: sleep on, to the deadline.
		if timeout > 0 {
			left := l.sleepUntil - l.mono()
			if left <= 0 {
				return 0, false, nil
			}
			timeout = timeoutMillis(left)
		}
	}
}

// callersSee reports whether every event is of an fd in the callers' set.
func callersSee(evs []unix.EpollEvent) bool {
	for i := range evs {
		if uint32(evs[i].Pad)&seenBit == 0 {
			return false
		}
	}
	return true
}

// testOuterAlways, set by a test, makes every loop block on its outer set, as within
// outerWindow of a caller's wait.
var testOuterAlways atomic.Bool

// testHookLeaving, when set by a test, runs as the loop leaves its set to a turn's holder,
// between finding the turn taken and disarming the set.
var testHookLeaving atomic.Pointer[func()]

// giveBackLoopBlind ends the loop's disarm of its own set for a caller (waitOuter), under
// holdMu.
func (l *Loop) giveBackLoopBlind() {
	if l.loopBlind.Load() {
		l.loopBlind.Store(false)
		l.blind(-1)
	}
}

// callerPolls reports whether a caller of this busy-polling loop spins now or spun within
// the last callerWindow: the loop leaves the polling to it and does not spin.
func (l *Loop) callerPolls() bool {
	return l.cfg.busyPoll > 0 && (l.holds.Load() > 0 || l.mono()-l.released.Load() < int64(l.callerWindow()))
}

// callerWindow is how long after its caller's last spin a busy-polling loop leaves the
// polling to it (blocks instead of spinning): the budget, at most a millisecond.
func (l *Loop) callerWindow() time.Duration { return min(l.cfg.busyPoll, time.Millisecond) }

// timeout is the blocking epoll_wait timeout in ms: -1 without timers, the next deadline
// rounded up otherwise, 0 when work is pending.
func (l *Loop) timeout() int {
	if len(l.kicks) > 0 || l.q.ready() {
		return 0
	}
	if len(l.timers) == 0 {
		return -1
	}
	return timeoutMillis(l.timers[0].when - l.mono())
}

// timeoutMillis rounds d (ns) up to epoll_wait's milliseconds, so a timer is never early.
func timeoutMillis(d int64) int {
	if d <= 0 {
		return 0
	}
	ms := (d + int64(time.Millisecond) - 1) / int64(time.Millisecond)
	if ms > math.MaxInt32 {
		ms = math.MaxInt32
	}
	return int(ms)
}

// spin is the busy-poll phase: it returns (n, true) as soon as there is work, (0, false)
// when the budget ran out with none or a caller of this loop started spinning instead.
func (l *Loop) spin() (n int, work bool) {
	deadline := l.mono() + int64(l.cfg.busyPoll)
	for {
		if l.holds.Load() > 0 {
			return 0, false // a caller of this loop spins instead: one spinner per process
		}
		l.st.busyPolls.Add(1)
		if n, err := unix.EpollWait(l.epfd, l.events, 0); err == nil && n > 0 {
			return n, true
		}
		if l.q.ready() || len(l.kicks) > 0 || l.stopped.Load() {
			return 0, true
		}
		now := l.mono()
		if len(l.timers) > 0 && l.timers[0].when <= now {
			return 0, true
		}
		gen := l.watchGen
		for i := 0; i < len(l.watches) && gen == l.watchGen; i++ {
			l.cbStart = now
			if l.watches[i].spinPoll() {
				return 0, true
			}
		}
		if now >= deadline {
			return 0, false
		}
		// Give the CPU to any other runnable thread (the caller this loop serves, a peer
		// process on a small machine): a spin that starves them is slower than sleeping.
		_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
	}
}

// HoldSpin makes a busy-polling loop block instead of spinning until the matching
// ReleaseSpin: for a caller that spins on its own completion, so that the process spins in
// one place. The holder polls the loop (Poll) while it spins: from a holder's first Poll the
// loop's own set is disarmed in the outer set the loop blocks on, so the kernel does not wake
// the loop for the completions the caller reaps (the loop still wakes for submissions, Stop
// and its timers). Not before that Poll: the holder's send leaves first, with no system call
// of the disarm before it. Safe from any goroutine; allocation-free. Without busy poll it
// only counts.
func (l *Loop) HoldSpin() { l.holds.Add(1) }

// ReleaseSpin ends a HoldSpin.
func (l *Loop) ReleaseSpin() {
	l.holdMu.Lock()
	l.released.Store(l.mono())
	if l.holds.Add(-1) == 0 && l.holdBlind.Load() {
		l.holdBlind.Store(false)
		l.blind(-1)
	}
	l.holdMu.Unlock()
}

// watchForHolders disarms the loop's set for the spin holders, once (Poll).
func (l *Loop) watchForHolders() {
	if l.cfg.busyPoll <= 0 || l.holdBlind.Load() || l.holds.Load() == 0 {
		return
	}
	l.holdMu.Lock()
	if l.holds.Load() > 0 && !l.holdBlind.Load() {
		l.holdBlind.Store(true)
		l.blind(+1)
	}
	l.holdMu.Unlock()
}

// blind counts the callers that watch the loop's set for it (a spin holder that polls, a
// ExecWait): the first disarms the set in the outer set the loop blocks on, the last arms it
// again (what became ready meanwhile then wakes the loop). Callers hold holdMu.
func (l *Loop) blind(d int) {
	l.blinds += d
	if l.outer < 0 {
		return // the loop has stopped and closed its sets
	}
	ev := unix.EpollEvent{Fd: int32(l.epfd)}
	switch {
	case d > 0 && l.blinds == 1:
	case d < 0 && l.blinds == 0:
		ev.Events = unix.EPOLLIN
	default:
		return
	}
	_ = unix.EpollCtl(l.outer, unix.EPOLL_CTL_MOD, l.epfd, &ev)
}

// dispatch hands ready events to their owners; it reports whether the wake-up eventfd was
// among them and whether any other event was handled. A borrowed turn leaves the eventfd to
// the loop: a producer that flipped the loop awake wrote it for the loop thread (still in
// epoll_wait), and reading it here would leave that thread asleep while producers take it
// for awake.
func (l *Loop) dispatch(evs []unix.EpollEvent, borrowed bool) (woken, handled bool) {
	for i := range evs {
		ev := &evs[i]
		e := l.fds.get(int(ev.Fd))
		if e == nil || e.gen != uint32(ev.Pad)&genMask {
			continue // removed (or replaced) by an earlier callback of this batch
		}
		switch e.kind {
		case kindWake:
			woken = true
			if borrowed {
				continue
			}
			_, _ = unix.Read(l.wfd, l.wakeBuf[:])
			l.st.submitEvents.Add(1)
		case kindUser:
			handled = true
			l.st.fdEvents.Add(1)
			e.h(Events(ev.Events))
			l.endCallback("fd", int(ev.Fd))
		case kindChannel:
			handled = true
			l.drainChannel(e.cw, false)
			l.runKicks()
		}
	}
	return woken, handled
}

// runQueue runs at most one queue's worth of submitted funcs, so that a flood of submissions
// cannot starve the fds and timers; it returns how many ran.
func (l *Loop) runQueue() int {
	tracepoint.Mark(tracepoint.RunQueue, 0)
	n := 0
	for n < int(l.q.size) {
		f, ok := l.q.pop()
		if !ok {
			break
		}
		n++
		l.st.submissions.Add(1) // before f: whoever f signals sees it counted
		f()
		l.endCallback("submit", 0)
	}
	if n > 0 {
		if l.waiters.Load() > 0 {
			l.roomMu.Lock()
			close(l.room)
			l.room = make(chan struct{})
			l.roomMu.Unlock()
		}
	}
	return n
}

func (l *Loop) endCallback(source string, id int) {
	end := l.mono()
	d := end - l.cbStart
	l.cbStart = end
	if d > l.longest {
		l.longest = d
		l.st.longest.Store(d)
	}
	if l.cfg.slow > 0 && d > int64(l.cfg.slow) {
		l.st.slowCalls.Add(1)
		l.log.Warn().Str("source", source).Int("id", id).Dur("took", time.Duration(d)).
			Dur("threshold", l.cfg.slow).Msg("reactor: slow callback")
	}
}

func (l *Loop) shutdown() {
	// Barrier: every Submit that got past the stopped check has pushed by now, and no Submit
	// will push or write the eventfd again.
	l.mu.Lock()
	l.mu.Unlock() // an empty critical section: the point is to wait for the readers
	for l.runQueue() > 0 {
	}
	l.flushCQs()
	for _, cw := range l.chans {
		if !cw.failed {
			l.drainChannel(cw, false)
		}
		for _, w := range cw.cqs {
			w.closed = true
		}
	}
	l.kicks = l.kicks[:0]
	for fd, e := range l.fds.s {
		if e != nil && e.kind == kindUser {
			_ = unix.Close(fd)
		}
	}
	_ = unix.Close(l.wfd)
	l.holdMu.Lock() // a HoldSpin or ReleaseSpin (any goroutine) may be arming the outer set
	_ = unix.Close(l.outer)
	l.outer = -1
	l.holdMu.Unlock()
	_ = unix.Close(l.epfd)
	_ = unix.Close(l.callers)
	l.fds, l.chans, l.watches, l.timers = fdTable{}, nil, nil, nil
	l.gid.Store(0)
	close(l.done)
}

// waitedLately reports whether a caller waited as the loop within outerWindow (never: false,
// so an engine whose callers never wait so always blocks on its own set).
func (l *Loop) waitedLately() bool {
	at := l.waitTurnAt.Load()
	return at != 0 && l.mono()-at < int64(outerWindow)
}

// outerWindow is how long after an ExecWait the loop keeps blocking on its outer set. A
// caller that waits as the loop while the loop blocks on its own set is still right, but
// both threads wake for its events until the loop's next wait.
const outerWindow = 100 * time.Millisecond

// newOuterSet makes the set the loop blocks on: the wake-up eventfd and the loop's own set.
func newOuterSet(wfd, epfd int) (int, error) {
	outer, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("reactor: epoll_create1: %w", err)
	}
	for _, fd := range []int{wfd, epfd} {
		ee := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
		if err := unix.EpollCtl(outer, unix.EPOLL_CTL_ADD, fd, &ee); err != nil {
			_ = unix.Close(outer)
			return -1, fmt.Errorf("reactor: epoll_ctl add %d to the outer set: %w", fd, err)
		}
	}
	return outer, nil
}
