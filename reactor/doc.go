// Package reactor is twosided's event loop: one goroutine, locked to one OS thread
// (runtime.LockOSThread), that owns one epoll set and everything waited on through it — the
// completion-channel fds of the CQs it watches, a wake-up eventfd, its timers, and the fds
// other packages hand it with Add (the OOB listener and connections).
//
// Status: an internal layer of twosided, kept importable for the benchmark and the tools
// (cmd/twosided, bench, tests). Its API may change without notice; applications use
// package notify. docs/design.md describes how the layers fit together.
//
// It owns: the epoll fd, the wake-up eventfd, the fds given to Add (closed at Stop unless
// removed first), the timer heap, the submission queue, and the completion handling rule
// (docs/design.md, "Completion handling rule") for the CQs given to WatchCQ. It must not touch: QPs,
// MRs, protocol state, or the CompChannel/CQ objects' lifetime (it never closes a channel nor
// destroys a CQ; it only registers the channel fd, polls, arms and acknowledges events).
//
// Threading. Other goroutines only Submit funcs; everything else (Add, Modify, Remove, Close,
// AfterFunc, Timer.Reset/Stop, WatchCQ, CQWatch.Kick/Close) is loop-only: call it from a
// Handler, a timer or a submitted func. InLoop tells which goroutine is which: the loop's OS
// thread runs nothing but the loop goroutine, so comparing thread ids is exact.
//
// Borrowed turns. The loop's work is guarded by its turn, a mutex the loop goroutine holds
// except while it blocks. While the loop sleeps, a caller may borrow the turn (TryLock only:
// a borrower never waits for it, so no lock order exists) and run loop work on its own
// thread, locked to it for the turn, with InLoop true: Exec runs a submitted func at once
// (no eventfd write, no loop wake-up), Poll runs one turn that does not block (a busy-polling
// caller reaps its own completion), ExecWait runs a func and then blocks as the loop, in
// the same turn (a send and the wait for its answer: the answer wakes the waiting caller's
// thread, not the loop's and then the caller's). Exactly one thread does loop work at any
// time; what changes is which. A borrowed turn leaves the wake-up eventfd to the loop,
// flushes the doorbells before it ends, and wakes the loop when it left work (a func queued
// meanwhile, a timer earlier than the loop's sleep). The loop blocks on an outer set holding
// its eventfd and its own epoll set (on its own set directly when no caller waited as the
// loop for 100 ms and busy poll is off: one epoll_wait per wake-up); a spinning caller
// (HoldSpin, from its first Poll) disarms the own set there, so that the kernel does not
// wake the loop for the completions the caller reaps.
//
// Callers' set. ExecWait's caller blocks on a third set, the callers' set: the wake-up
// eventfd and every fd whose handler drains (AddDrained: the OOB connections; the
// completion channels), each added to the callers' set first and to the loop's own set
// second, both with EPOLLEXCLUSIVE. The kernel runs an fd's wake-ups in the order they were
// added and stops at the first exclusive one whose set has a thread waiting in epoll_wait
// (fs/eventpoll.c, ep_poll_callback; a set without a waiter only queues the fd): while a
// caller waits on the callers' set, an answer wakes that caller and nothing else; otherwise
// the loop, as before. The wait costs no system call to set up. It replaced a disarm and a
// re-arm of the own set in the outer set around each wait (two epoll_ctl, the re-arm
// between the answer and the caller's return): five alternating rounds, two processes,
// 40 000 acked notifies of 64 B over OOB, one-way p50 20.9 -> 19.9 µs (oob / floor-block
// 1.37 -> 1.30), CPU per notify 57.2 -> 53.6 µs. What the callers' set cannot promise is
// handled so: a handler that leaves readiness behind (Add) keeps its fd in the own set
// alone, and its event during such a wait is taken over (the loop, woken for it, ends the
// wait through the eventfd and handles it once the turn is back: Stats.TakenOver); a
// draining fd the kernel will not add exclusively (an epoll fd: the soft provider's
// channels) makes ExecWait wait in the own set, disarmed in the outer set, as before; a
// registration cannot be modified in place once exclusive, so Modify takes the fd out of
// both sets and adds it again, in the same order. And an event that comes while the caller
// is busy with an earlier one (not in epoll_wait) wakes the loop, which then disarms its set
// and has the turn give it back: a wake-up and the two epoll_ctl. One answer per wait
// rarely does (one wait in eight: the answer beat the wait's start); an answer with a
// second event close behind (a peer's echo, then its ACK) does in about half the waits, and
// there the disarm for the whole wait costs less (echoed round trips: CPU per notify 114
// -> 129 µs on the callers' set alone, 110 with the choice). So ExecWait keeps the share of
// its waits on the callers' set that woke the loop and above 3 in 10 waits disarmed, trying
// the callers' set every 16th wait (waitChoice).
//
// What each mechanism gives. Each was switched off in turn (a build switch for the
// measurement only) and run alternated with the full build, six pairs per row: two
// processes, rdma_twosided, 3000 sequential echoed notifies of 64 B, on the soft provider
// and on the verbs provider over softverbs (the project's userspace libibverbs), event mode
// and busy poll 50 µs; the figure is the median, over the pairs, of off / on for one-way
// p50 and CPU per notify (> 1: the mechanism pays). Noise is the median ratio between
// consecutive runs of the full build: soft ±6 % (events) and ±18 % (busy), verbs ±2 % and
// ±50 %. Kept where the gain is beyond the noise:
//
//	mechanism        mode    soft p50, CPU   verbs p50, CPU   wake-ups/notify off   kept
//	ExecWait         events  1.83, 1.71      1.36, 1.26       2.2 -> 3.8            yes
//	outer set        events  1.15, 1.14      1.10, 1.09       2.2 -> 2.8            yes
//	outer set        busy    2.14, 2.07      1.33, 1.27       0.3 -> 1.2            yes
//	HoldSpin         busy    1.56, 1.10      1.65, 1.92       -                     yes
//	Poll             busy    1.52, 1.08      1.24, 1.21       0.4 -> 1.0            yes
//	Exec             busy    1.11, 1.09      1.64, 1.39       0.3 -> 1.0            yes
//	Exec             events  1.03, 0.97      0.98, 1.00       -                     (yes: busy)
//	WaitTurn         events  0.96, 0.94      1.03, 1.01       -                     removed
//	modeGate         busy    0.96, 0.84      1.12, 1.06       -                     removed
//	SpinGate         busy    0.86, 0.97      0.93, 0.94       -                     removed
//
// SpinGate (stop spinning while spins miss) and modeGate (spin or wait per call, by which
// was faster) were also run with a 5 µs budget, far below the round trip, where they should
// pay most: CPU per notify with them off rose 5 % (soft) and 9 % (verbs), within the noise.
// WaitTurn (wait as the loop after a send that was queued, not borrowed) was within the
// noise in every row.

// Nesting. The kernel limits epoll sets inside epoll sets (fs/eventpoll.c): a chain of at
// most EP_MAX_NESTS = 4 sets inside sets (ELOOP beyond), and for each file that is not an
// epoll set (a socket, an eventfd) a cap on its wake-up paths to the outermost sets above it,
// counted by depth: unlimited for a file directly in an outermost set, then path_limits 500,
// 100, 50, 10 for 1, 2, 3, 4 sets in between (EINVAL beyond). Every fd the loop waits on,
// with its depth below the outer set (depth 0), which is the outermost set the loop blocks on
// (it blocks on its own set directly when no caller waited as the loop lately and busy poll
// is off; the kernel still counts from the outer set, which always holds the own set):
//
//	depth  fd                                              in                 paths
//	0      outer set (epoll)                               -                  -
//	1      wake-up eventfd                                 outer set          1 (and 1 below)
//	1      own set (epoll): Poll waits on it               outer set          1
//	2      wake-up eventfd                                 own set            1
//	2      fds given to Add, AddDrained (OOB listener,     own set            1
//	         connections)
//	2      completion-channel fd of each watched CQ        own set            1
//	         hardware (ibv/verbs): the channel's own fd
//	         soft provider: an epoll fd of the channel's
//	3      soft: the channel's eventfd                     its channel's fd   1
//	3      soft: the device's progress set (epoll)         the holder's fd    1 per device
//	4      soft: the device's connection sockets           progress set       1
//
// The callers' set is an outermost set of its own (ExecWait's caller blocks on it, nothing
// holds it) with no set inside it: the wake-up eventfd and the draining fds are in it
// directly (unlimited paths), and the soft provider's channel fds, being epoll sets, never
// are (the kernel refuses EPOLLEXCLUSIVE for an epoll fd). It adds no link to any chain.
//
// The longest chain of sets is outer set → own set → soft channel fd → progress set: 3 links
// of the 4 allowed. Every file has one path (the wake-up eventfd two, at depths 0 and 1) to
// the outer set of the one loop that waits on it, whatever the number of channels, loops or
// engines in the process: a channel is watched by one loop, and a soft device's progress set
// is nested in one channel's fd per process at a time (the holder, ibv/soft), not in every
// channel's. So no count reaches a cap: what bounds channels and engines is RLIMIT_NOFILE
// (4 fds per loop, 2 per soft channel) and fs.epoll.max_user_watches (one watch per line
// above, and one more per draining fd and loop in the callers' set). Anything that puts one file in several sets multiplies its paths: the progress set
// nested in every soft channel's fd gave each socket one path per channel of the process,
// and with the outer set (depth 3, cap 50) the 51st channel of a process failed to register.
// scale_test.go holds 1000 channels on one loop and 1000 loops on one device.
//
// Submissions. A bounded lock-free multi-producer ring (Vyukov's array queue, single consumer)
// of func values; Submit allocates nothing. The loop publishes "asleep" before it blocks and
// re-checks the queue; a producer writes the eventfd only if it is the one that flips the loop
// from asleep to awake, so a batch of submissions costs one eventfd write. A full queue is
// ErrQueueFull for Submit; SubmitWait parks on a channel the loop closes after it frees room,
// bounded by the caller's context. Nothing spins and the queue never grows.
//
// Timers live in a heap; the blocking epoll_wait takes the next deadline as its timeout,
// rounded up to whole milliseconds (epoll_wait's unit), so a timer fires at its deadline or up
// to a millisecond later, never early. There is no fixed-interval tick: with no timer, no
// submission and no ready fd, the loop sleeps until something happens (Stats.Wakeups stays 0).
//
// Completions. WatchCQ applies the completion handling rule of docs/design.md to a CQ: poll until empty
// handing every WC to the CQHandler; Repost; ReqNotify, then poll once more and go back to the
// drain if anything came (a CQE that landed between the last poll and the arm raised no
// event); sleep. A CQ whose last arm's event has not been read is not armed again, so a
// channel holds at most one event per armed CQ. When the channel fd is readable: GetEvent
// until each armed CQ of the channel has given its event (or ErrWouldBlock), not once more
// to see it empty; AckEvents once per CQ for the batch, then the cycle again. A spurious
// event with an empty CQ is normal. Several CQs may share a channel; its fd is in the epoll
// set once.
//
// Doorbells. A watched CQ that implements Flusher (the soft provider's does) is flushed once
// per loop iteration, after the fds, submissions, timers and CQ cycles of the turn and before
// the loop sleeps or spins: a provider may hold the writes of what the turn posted (and the
// acknowledgements its progress owes) until then, so one turn's sends leave in one write.
//
// Busy poll. WithBusyPoll(budget) makes the loop spin up to budget after its last piece of
// work — epoll_wait with timeout 0, the submission queue, and every watched CQ polled
// directly — before it arms the CQs and blocks. While spinning the CQs stay unarmed, so a
// completion costs no channel event; they are armed (and polled once more) right before the
// loop blocks. Each empty round yields the CPU (sched_yield): on a small machine a spin that
// starves the threads it serves (the caller, a peer process) is slower than sleeping. The
// default, 0, never spins. HoldSpin (any goroutine) makes the loop block instead of spinning
// until ReleaseSpin: a caller that spins on its own completion holds it, so that a process
// spins in one place. While held, the caller polls the loop's set itself (Poll) and, from
// its first Poll, the loop's set is disarmed in the outer set the loop blocks on (as for
// ExecWait after its func), so that the
// kernel does not wake the loop for the completions the caller reaps; for the budget (at
// most 1 ms) after a release the loop blocks rather than spins, leaving the next call's turn
// to the caller.
//
// Waiter. A goroutine off the loop that waits for the loop's answer can wait in poll(2) on
// a Waiter's eventfd: the loop signals it with one write and readies no goroutine.
//
// Why not gnet. gnet.Engine runs its own epoll and cannot host foreign fds (completion
// channels). gnet's pkg/netpoll Poller.Polling blocks without a timeout (no timers without an
// extra timerfd), yields with runtime.Gosched between rounds and has no busy-poll or wake-up
// coalescing hook, and its task queue is unbounded and allocates a node per task. So the loop is built on
// golang.org/x/sys/unix epoll and eventfd directly and uses no gnet package; the OOB package
// uses gnet's buffers for its sockets on top of Add.
package reactor
