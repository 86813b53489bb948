package notify

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/oob"
)

// This file drives peerMachines through an in-memory network, deterministically: every
// message (handshake request and reply, channel frame and its ACK, OOB notify and its
// reply) is an event in one pool, and a seeded scheduler picks which happens next, so
// handshakes race traffic, fallbacks race channels and names race each other in every
// order. Channels keep RC's rules: frames of one channel arrive in order, a frame arrives
// at most once, and its sender learns success only from the ACK of a frame that arrived.

type simEngine struct {
	name     string
	m        *peerMachine
	net      *simNet
	got      []Notify
	results  map[reqID]error
	posted   map[reqID]string // the notify each request carries
	nids     map[reqID]string
	links    map[chanID]*simLink
	nextReq  reqID
	timerAt  time.Time
	rng      *rand.Rand
	closedCh map[chanID]bool
	trace    func(mAction)
	// Restarts (simNet.restart): the names it answers to, its incarnation, whether it was
	// killed, what its machine held when it was, and which engine acknowledged each of
	// its requests.
	aliases []string
	inc     int
	dead    bool
	heldAt  int
	acker   map[reqID]*simEngine
}

// simLink is one end of a connected channel.
type simLink struct {
	local  *simEngine
	id     chanID
	remote *simLink
	dead   bool
	// frames in flight towards the remote end, in order
	q []simFrame
}

type simFrame struct {
	req         reqID
	seq         uint64
	fence       bool
	first, cnt  uint64
	msg, nid    string
	arrived     bool
	fromSession uint64
}

type simNet struct {
	t       *testing.T
	rng     *rand.Rand
	now     time.Time
	engines map[string]*simEngine
	alias   map[string]string // name -> engine name
	events  []func()
	past    map[string][]*simEngine // name -> its killed incarnations, oldest first
	traceHS func(string)            // handshake replies, when tracing
}

func newSimNet(t *testing.T, seed uint64) *simNet {
	return &simNet{t: t, rng: rand.New(rand.NewPCG(seed, 99)), now: time.Unix(1000, 0),
		engines: map[string]*simEngine{}, alias: map[string]string{}, past: map[string][]*simEngine{}}
}

func (n *simNet) add(name string, session uint64, cfg machineConfig, aliases ...string) *simEngine {
	tok := uint64(session << 16)
	e := &simEngine{name: name, net: n, results: map[reqID]error{}, posted: map[reqID]string{}, nids: map[reqID]string{},
		links: map[chanID]*simLink{}, closedCh: map[chanID]bool{}, aliases: aliases, acker: map[reqID]*simEngine{}}
	e.m = newPeerMachine(session, cfg, func() uint64 { tok++; return tok })
	n.engines[name] = e
	n.alias[name] = name
	for _, a := range aliases {
		n.alias[a] = name
	}
	return e
}

func (n *simNet) post(f func()) { n.events = append(n.events, f) }

// restart kills engine name (kill -9: its machine stops, its channels die, what it held
// is lost) and starts a new incarnation of it on the same names with session.
func (n *simNet) restart(name string, session uint64, cfg machineConfig) *simEngine {
	old := n.engines[name]
	old.dead = true
	for _, p := range old.m.peers {
		if p.win != nil {
			old.heldAt += p.win.held
		}
	}
	for _, id := range sortedChans(old) {
		l := old.links[id]
		if l.dead {
			continue
		}
		l.dead = true
		l.q = nil // what it had not sent dies with it
		if r := l.remote; r != nil && !r.dead {
			// The peer's QP finds it gone (retry exceeded, or the keepalive).
			n.post(func() {
				r.local.closeLink(r.id)
				r.local.m.chanClosed(n.now, r.id, errors.New("peer killed"))
				r.local.perform()
			})
		}
	}
	n.past[name] = append(n.past[name], old)
	e := n.add(name, session, cfg, old.aliases...)
	e.inc = old.inc + 1
	return e
}

// errReset is what an OOB request on a connection to a killed engine gets: it may have
// been written (maybe delivered).
func errReset(name string) error {
	return &kindError{kind: ErrPeerUnreachable, cause: fmt.Errorf("%w: %s: connection reset by peer", oob.ErrPeerUnreachable, name)}
}

// step runs one event picked at random; false when none is left.
func (n *simNet) step() bool {
	if len(n.events) == 0 {
		return false
	}
	i := n.rng.IntN(len(n.events))
	f := n.events[i]
	n.events = append(n.events[:i], n.events[i+1:]...)
	n.now = n.now.Add(time.Duration(n.rng.IntN(50)) * time.Microsecond)
	f()
	return true
}

// maxRoundEvents bounds the events of one round of runWith (the largest test posts a few
// hundred thousand).
const maxRoundEvents = 5_000_000

// run steps until quiet, then lets time pass for the machines' timers.
func (n *simNet) run() { n.runWith(time.Time{}, nil) }

// runWith is run with timers due before until only (zero: all), and after called after
// each event and each round of timers (nil: nothing).
func (n *simNet) runWith(until time.Time, after func()) {
	step := func() bool {
		ok := n.step()
		if after != nil {
			after()
		}
		return ok
	}
	for rounds := 0; rounds < 200; rounds++ {
		// Every machine exchange ends: a round that never goes quiet is a livelock (two
		// engines trading the same refusal), reported as one instead of a hang.
		for steps := 0; step(); steps++ {
			if steps == maxRoundEvents {
				n.t.Fatalf("no quiet after %d events with no timer due: a livelock", steps)
			}
		}
		var next time.Time
		for _, e := range n.engines {
			if !e.timerAt.IsZero() && (next.IsZero() || e.timerAt.Before(next)) {
				next = e.timerAt
			}
		}
		if next.IsZero() || (!until.IsZero() && next.After(until)) {
			return
		}
		if next.After(n.now) {
			n.now = next
		}
		for _, name := range slices.Sorted(maps.Keys(n.engines)) { // in a fixed order: runs reproduce
			e := n.engines[name]
			if !e.timerAt.IsZero() && !e.timerAt.After(n.now) {
				e.timerAt = time.Time{}
				e.m.tick(n.now)
				e.perform()
			}
		}
		if after != nil {
			after()
		}
	}
}

func (e *simEngine) send(to, msg, nid string) reqID {
	e.nextReq++
	id := e.nextReq
	e.posted[id], e.nids[id] = msg, nid
	e.m.send(e.net.now, id, to, nid, e.net.now.Add(time.Hour), 0)
	e.perform()
	return id
}

func (e *simEngine) perform() {
	if e.dead {
		return // killed: it does nothing more
	}
	for {
		acts := e.m.ready()
		if len(acts) == 0 {
			return
		}
		for _, a := range acts {
			e.do(a)
		}
	}
}

func (e *simEngine) do(a mAction) {
	n := e.net
	if e.trace != nil {
		e.trace(a)
	}
	switch a.kind {
	case aConnect:
		n.post(func() { n.handshake(e, a) })
	case aPost:
		l := e.links[a.ch]
		if l == nil || l.dead {
			n.post(func() { e.m.sendResult(n.now, a.req, errors.New("qp down"), false, false); e.perform() })
			return
		}
		e.enqueueFrame(l, simFrame{req: a.req, seq: a.seq, msg: e.posted[a.req], nid: e.nids[a.req], fromSession: e.m.local})
	case aFence:
		if l := e.links[a.ch]; a.ch != 0 && l != nil && !l.dead {
			e.enqueueFrame(l, simFrame{fence: true, first: a.first, cnt: a.count})
			return
		}
		to := n.engines[n.alias[a.name]]
		n.post(func() {
			if to == nil || to.dead { // nobody at the name, or its connection reset (killed)
				err := errNobodyThere(a.name)
				if to != nil {
					err = errReset(a.name)
				}
				n.post(func() {
					e.m.fenceResult(n.now, a.session, a.first, a.count, a.token, a.pair, err)
					e.perform()
				})
				return
			}
			code, err := to.m.oobArrive(n.now, oobArrival{session: e.m.local, token: a.token, to: a.session, skipFrom: a.first, skipN: a.count})
			to.perform()
			err = simOOBErr(code, err)
			n.post(func() { e.m.fenceResult(n.now, a.session, a.first, a.count, a.token, a.pair, err); e.perform() })
		})
	case aOOB:
		to := n.engines[n.alias[a.name]]
		msg := e.posted[a.req]
		n.post(func() {
			code, err, maybe := "", error(nil), false
			switch {
			case to == nil:
				err = errNobodyThere(a.name)
			case to.dead: // the connection was to an engine killed since
				err, maybe = errReset(a.name), true
			default:
				code, err = to.m.oobArrive(n.now, oobArrival{session: e.m.local, token: a.token, to: a.session, seq: a.seq,
					nid: e.nids[a.req], from: e.name, n: Notify{Msg: []byte(msg)}})
				to.perform()
				err = simOOBErr(code, err)
			}
			n.post(func() {
				if err == nil {
					e.acker[a.req] = to
				}
				e.m.sendResult(n.now, a.req, err, maybe, false)
				e.perform()
			})
		})
	case aComplete:
		if _, dup := e.results[a.req]; dup {
			n.t.Fatalf("%s: request %d completed twice", e.name, a.req)
		}
		e.results[a.req] = a.err
	case aClose:
		e.closeLink(a.ch)
	case aDeliver:
		e.got = append(e.got, a.n)
	case aTimer:
		if e.timerAt.IsZero() || a.at.Before(e.timerAt) {
			e.timerAt = a.at
		}
	}
}

// errNobodyThere is the error the driver reports for an OOB connection to name that
// nobody listens at (oob's "connection refused": nothing sent).
func errNobodyThere(name string) error {
	return &kindError{kind: ErrPeerUnreachable, cause: fmt.Errorf("%w: %w: %s: connect: connection refused", oob.ErrPeerUnreachable, oob.ErrNotSent, name)}
}

// simOOBErr is an OOB answer as the driver maps it (oobKind): nil when accepted.
func simOOBErr(code string, err error) error {
	switch code {
	case "":
		return nil
	case refuseAuth:
		return &kindError{kind: ErrAuth, cause: errors.Join(errRebind, err)}
	case refuseStale:
		return &kindError{kind: ErrRejected, cause: errors.Join(errGaveUp, err)}
	case refuseBusy:
		return &kindError{kind: ErrBackpressure, cause: errors.Join(errPeerBusy, err)}
	}
	return err
}

func (e *simEngine) enqueueFrame(l *simLink, f simFrame) {
	l.q = append(l.q, f)
	e.net.post(func() { e.net.deliverHead(l) })
}

// deliverHead delivers the oldest frame in flight on l (RC order), then its ACK.
func (n *simNet) deliverHead(l *simLink) {
	if len(l.q) == 0 {
		return
	}
	f := l.q[0]
	l.q = l.q[1:]
	e, r := l.local, l.remote
	if l.dead || r == nil || r.dead || r.local.dead {
		if !f.fence {
			n.post(func() { e.m.sendResult(n.now, f.req, errors.New("retry exceeded"), true, false); e.perform() })
		}
		return
	}
	if f.fence {
		r.local.m.chanFence(n.now, r.id, f.first, f.cnt)
	} else {
		r.local.m.chanArrival(n.now, r.id, f.seq, f.nid, Notify{Msg: []byte(f.msg)})
	}
	r.local.perform()
	if !f.fence {
		n.post(func() {
			if !l.dead {
				e.acker[f.req] = r.local
				e.m.sendResult(n.now, f.req, nil, false, false)
			} else {
				// Our side closed before the ACK was reaped: the flush error.
				e.m.sendResult(n.now, f.req, errors.New("flushed"), true, false)
			}
			e.perform()
		})
	}
}

func (e *simEngine) closeLink(id chanID) {
	if e.closedCh[id] {
		return
	}
	e.closedCh[id] = true
	l := e.links[id]
	n := e.net
	if l != nil {
		l.dead = true
		// Sends in flight on our side fail (flushed); the peer's side learns by its next
		// frame or keepalive: here, at once.
		for _, f := range l.q {
			if !f.fence {
				f := f
				n.post(func() { e.m.sendResult(n.now, f.req, errors.New("flushed"), true, false); e.perform() })
			}
		}
		l.q = nil
		if r := l.remote; r != nil && !r.dead {
			n.post(func() {
				r.local.closeLink(r.id)
				r.local.m.chanClosed(n.now, r.id, errors.New("peer closed"))
				r.local.perform()
			})
		}
	}
	n.post(func() { e.m.chanClosed(n.now, id, errors.New("closed")); e.perform() })
}

// handshake carries a's handshake to the engine behind a.name and its reply back.
func (n *simNet) handshake(from *simEngine, a mAction) {
	if from.dead {
		return // killed before its handshake went out
	}
	to := n.engines[n.alias[a.name]]
	if to == nil {
		from.m.connected(n.now, a.name, a.ch, hsResult{err: errNobodyThere(a.name)})
		from.perform()
		return
	}
	rep := to.m.inbound(n.now, inboundHS{name: from.name, session: from.m.local, token: a.token, proof: a.proof,
		epoch: a.epoch, ctrl: a.ch != 0})
	var rl *simLink
	if rep.ch != 0 {
		rl = &simLink{local: to, id: rep.ch}
		to.links[rep.ch] = rl
		to.m.inboundUp(n.now, rep.ch, nil)
	}
	to.perform()
	n.post(func() {
		if from.dead {
			// The reply found the dialer killed: the channel it answered has nobody at
			// the other end, which its QP finds out (retry exceeded).
			if rl != nil && !rl.dead {
				to.closeLink(rl.id)
				to.m.chanClosed(n.now, rl.id, errors.New("peer killed"))
				to.perform()
			}
			return
		}
		res := hsResult{session: to.m.local, token: rep.token, epoch: rep.epoch, refuse: rep.refuse, peerName: to.name, fresh: rep.fresh}
		if a.ch != 0 && rl != nil && rep.refuse == "" {
			ll := &simLink{local: from, id: a.ch, remote: rl}
			rl.remote = ll
			from.links[a.ch] = ll
			ll.dead = to.closedCh[rl.id]
			res.ctrl = true
		}
		if n.traceHS != nil {
			n.traceHS(fmt.Sprintf("%s.%d handshake via %s (ch %d) answered by %s.%d: session %d refuse %q fresh %v", from.name, from.inc, a.name, a.ch, to.name, to.inc, res.session, res.refuse, res.fresh))
		}
		from.m.connected(n.now, a.name, a.ch, res)
		from.perform()
		if ll := from.links[a.ch]; ll != nil && ll.dead && !from.closedCh[a.ch] {
			// The peer closed its end before our reply arrived: our QP errors on its
			// first send (retry exceeded), and the channel closes, as a hardware QP does.
			from.closeLink(a.ch)
		}
	})
}

// checkDelivery: each acknowledged notify of from was delivered at to exactly once; none
// is delivered twice; deliveries are in send order; a refused one (not "maybe") is absent.
func checkDelivery(t *testing.T, from, to *simEngine, order []reqID) (acked int) {
	t.Helper()
	pos := map[string]int{}
	for i, n := range to.got {
		m := string(n.Msg)
		if _, dup := pos[m]; dup {
			t.Fatalf("%s delivered twice at %s", m, to.name)
		}
		pos[m] = i
	}
	last := -1
	for _, id := range order {
		msg := from.posted[id]
		err, done := from.results[id]
		require.True(t, done, "request %d (%s) never completed", id, msg)
		if err != nil && testing.Verbose() {
			t.Logf("%s: %v", msg, err)
		}
		p, delivered := pos[msg]
		if err == nil {
			acked++
			require.True(t, delivered, "%s acknowledged but not delivered", msg)
		} else if !errors.Is(err, ErrMaybeDelivered) {
			require.False(t, delivered, "%s failed (%v) yet was delivered", msg, err)
		}
		if delivered {
			require.Greater(t, p, last, "%s delivered out of order (%s)", msg, to.got)
			last = p
		}
	}
	return acked
}

func simCfg() machineConfig {
	return machineConfig{channels: true, fallback: true, maxPendingSends: 128, window: 256,
		connectTimeout: time.Second, gapTimeout: 10 * time.Second}
}

// TestMachineAliasesShareOnePeer: one engine reached as two names gets one peer entry,
// one sequence space and, in the end, one channel (or none: oob); every send is delivered
// once, in one order: the order of the sends, whichever name each went to, before and after
// each name's handshake told which engine it leads to.
func TestMachineAliasesShareOnePeer(t *testing.T) {
	for _, channels := range []bool{true, false} {
		for seed := uint64(0); seed < 300; seed++ {
			n := newSimNet(t, seed)
			cfg := simCfg()
			cfg.channels = channels
			a := n.add("a", 10, cfg)
			b := n.add("b", 20, cfg, "localhost:b", "127.0.0.1:b")
			var order []reqID
			for i := 0; i < 40; i++ {
				to := "localhost:b"
				if n.rng.IntN(2) == 0 {
					to = "127.0.0.1:b"
				}
				order = append(order, a.send(to, strconv.Itoa(i), ""))
				for k := n.rng.IntN(4); k > 0 && n.step(); k-- {
				}
			}
			n.run()
			for _, id := range order {
				require.NoError(t, a.results[id], "channels %v seed %d: request %d", channels, seed, id)
			}
			require.Equal(t, 40, checkDelivery(t, a, b, order), "channels %v seed %d", channels, seed)
			if channels { // (over oob the idle pair is forgotten by the end of run)
				require.Len(t, a.m.peers, 1, "seed %d: one peer for two names", seed)
				require.Equal(t, 1, a.m.channels, "seed %d", seed)
			}
		}
	}
}

// TestMachineSimultaneousOpenAndReplacement: both ends send at once (a simultaneous open),
// then one side reconnects many times while traffic flows both ways (each reconnect's
// channel replaces the current one on both sides). Nothing acknowledged is lost, nothing is
// delivered twice or out of order, and both ends finish on the same single channel.
func TestMachineSimultaneousOpenAndReplacement(t *testing.T) {
	for seed := uint64(0); seed < 300; seed++ {
		n := newSimNet(t, seed)
		a := n.add("a", 10, simCfg())
		b := n.add("b", 20, simCfg())
		var ab, ba []reqID
		for i := 0; i < 60; i++ {
			ab = append(ab, a.send("b", "a"+strconv.Itoa(i), ""))
			ba = append(ba, b.send("a", "b"+strconv.Itoa(i), ""))
			if i%10 == 5 {
				// a reconnects: a handshake for a pair whose channel is up.
				if p := a.m.peers[peerKey{session: 20}]; p != nil && p.ch != 0 {
					ne := a.m.names["b"]
					if ne != nil && !ne.connecting {
						a.m.connectName(n.now, ne, p)
						a.perform()
					}
				}
			}
			for k := n.rng.IntN(6); k > 0 && n.step(); k-- {
			}
		}
		n.run()
		require.Equal(t, 60, checkDelivery(t, a, b, ab), "seed %d", seed)
		require.Equal(t, 60, checkDelivery(t, b, a, ba), "seed %d", seed)
		pa, pb := a.m.peers[peerKey{session: 20}], b.m.peers[peerKey{session: 10}]
		require.NotZero(t, pa.ch, "seed %d", seed)
		la := a.links[pa.ch]
		require.NotNil(t, la.remote, "seed %d", seed)
		require.Equal(t, pb.ch, la.remote.id, "seed %d: the two ends use different channels", seed)
		require.Equal(t, 1, a.m.channels, "seed %d", seed)
		require.Equal(t, 1, b.m.channels, "seed %d", seed)
	}
}

// TestMachineFallbackOrder: the channel dies under traffic; sends fall back to OOB with
// their seqs while later ones go on a new channel; the receiver still delivers in order.
func TestMachineFallbackOrder(t *testing.T) {
	for seed := uint64(0); seed < 300; seed++ {
		n := newSimNet(t, seed)
		a := n.add("a", 10, simCfg())
		b := n.add("b", 20, simCfg())
		var order []reqID
		for i := 0; i < 80; i++ {
			order = append(order, a.send("b", strconv.Itoa(i), ""))
			if i%20 == 10 {
				if p := b.m.peers[peerKey{session: 10}]; p != nil && p.ch != 0 {
					b.closeLink(p.ch) // the receiver's QP dies
					b.perform()
				}
			}
			for k := n.rng.IntN(5); k > 0 && n.step(); k-- {
			}
		}
		for n.step() {
		}
		require.Zero(t, b.m.peers[peerKey{session: 10}].win.held, "seed %d: a gap waits without timers", seed)
		n.run()
		require.Equal(t, 80, checkDelivery(t, a, b, order), "seed %d", seed)
	}
}

// TestMachineGivenUpSeqsAreFenced: without fallback, sends lost with a dead channel fail;
// the sender fences their seqs, so the receiver delivers what came after them at once.
func TestMachineGivenUpSeqsAreFenced(t *testing.T) {
	for seed := uint64(0); seed < 200; seed++ {
		n := newSimNet(t, seed)
		cfg := simCfg()
		cfg.fallback = false
		a := n.add("a", 10, cfg)
		b := n.add("b", 20, cfg)
		var order []reqID
		for i := 0; i < 50; i++ {
			order = append(order, a.send("b", strconv.Itoa(i), ""))
			if i == 25 {
				if p := b.m.peers[peerKey{session: 10}]; p != nil && p.ch != 0 {
					b.closeLink(p.ch)
					b.perform()
				}
			}
			for k := n.rng.IntN(5); k > 0 && n.step(); k-- {
			}
		}
		for n.step() {
		}
		checkDelivery(t, a, b, order)
		pb := b.m.peers[peerKey{session: 10}]
		require.Zero(t, pb.win.held, "seed %d: a gap waits although its seq was given up", seed)
		require.Zero(t, pb.win.stats.GapsTimedOut, "seed %d", seed)
	}
}

// TestMachineForgedSession: a third engine that learned a's session cannot inject into the
// a→b sequence space, over OOB (no token) nor by a handshake claiming a's session.
func TestMachineForgedSession(t *testing.T) {
	n := newSimNet(t, 1)
	a := n.add("a", 10, simCfg())
	b := n.add("b", 20, simCfg())
	var order []reqID
	for i := 0; i < 5; i++ {
		order = append(order, a.send("b", strconv.Itoa(i), ""))
	}
	n.run()
	// The attacker sends "future" seqs of a's session to b, with guessed tokens.
	for seq := uint64(6); seq < 1006; seq++ {
		code, err := b.m.oobArrive(n.now, oobArrival{session: 10, token: seq * 7, seq: seq, n: Notify{Msg: []byte("forged")}})
		require.Equal(t, refuseAuth, code)
		require.ErrorIs(t, err, ErrAuth)
	}
	// A handshake claiming a's session without the proof is refused too.
	rep := b.m.inbound(n.now.Add(time.Minute), inboundHS{name: "evil", session: 10, token: 1, ctrl: true})
	require.Equal(t, refuseAuth, rep.refuse)
	for i := 5; i < 15; i++ {
		order = append(order, a.send("b", strconv.Itoa(i), ""))
	}
	n.run()
	require.Equal(t, 15, checkDelivery(t, a, b, order))
	for _, g := range b.got {
		require.NotEqual(t, "forged", string(g.Msg))
	}
}

// TestMachineUnprovedEntryAnswersFresh: a handshake without proof answered on an entry
// that exists (replyLost) says the state is fresh (ts_fresh) when the entry was never
// proved and never sent nor received: here a third party claiming session 10 made it,
// and the real engine of that session, which forgot our token, handshakes after it. Its
// seqs of a pair we forgot would otherwise go on where our new window does not expect
// them. Once we sent in the pair, the reply says the state is kept.
func TestMachineUnprovedEntryAnswersFresh(t *testing.T) {
	now := time.Unix(1000, 0)
	tok := uint64(100)
	m := newPeerMachine(20, simCfg(), func() uint64 { tok++; return tok })
	rep := m.inbound(now, inboundHS{name: "evil", session: 10, token: 99, ctrl: true})
	require.Empty(t, rep.refuse)
	require.True(t, rep.fresh, "an entry made by the handshake")
	m.inboundUp(now, rep.ch, nil)
	now = now.Add(time.Second)
	rep = m.inbound(now, inboundHS{name: "a", session: 10, token: 5, ctrl: true})
	require.Empty(t, rep.refuse, "answered again: its first reply may have been lost")
	require.True(t, rep.fresh, "an entry nobody proved and that holds no state")
	m.inboundUp(now, rep.ch, nil)
	p := m.peers[peerKey{session: 10}]
	require.NotZero(t, p.ch)
	m.send(now, 1, "a", "", now.Add(time.Hour), 0)
	require.True(t, p.hasState(), "the send drew a seq in the pair")
	rep = m.inbound(now, inboundHS{name: "a", session: 10, token: 6, ctrl: true})
	require.Empty(t, rep.refuse)
	require.False(t, rep.fresh, "the entry sent in the pair: its state is not fresh")
}

// TestMachineCookieTakesUnusedEntry: a peer refused busy holds our cookie; a third party
// then makes an entry claiming its session. The cookie, returned by the real peer's
// handshake or its OOB notify, takes that entry's place while nobody has used it; once the
// entry was used, the cookie is refused (auth) and the entry stays. An entry made by the
// cookie's own handshake keeps the cookie: the peer's notifies sent under it land there.
func TestMachineCookieTakesUnusedEntry(t *testing.T) {
	now := time.Unix(1000, 0)
	tok := uint64(100)
	fresh := func() *peerMachine {
		m := newPeerMachine(20, simCfg(), func() uint64 { tok++; return tok })
		rep := m.inbound(now, inboundHS{name: "evil", session: 10, token: 99, ctrl: true})
		require.Empty(t, rep.refuse)
		return m
	}
	cookie := func(m *peerMachine) uint64 { return m.cookie(10, "a") }

	// A handshake proving the cookie: answered in a new entry, the third party's gone.
	m := fresh()
	evil := m.peers[peerKey{session: 10}]
	rep := m.inbound(now, inboundHS{name: "a", session: 10, token: 5, proof: cookie(m), ctrl: true})
	require.Empty(t, rep.refuse, "%v", rep.err)
	require.True(t, rep.fresh)
	p := m.peers[peerKey{session: 10}]
	require.NotSame(t, evil, p, "the cookie took the unused entry's place")
	require.NotEqual(t, evil.tokenIn[0], rep.token, "the third party's token does not lead to the new entry")
	require.Equal(t, uint64(1), m.stats.PeersEvicted)

	// An OOB notify under the cookie: accepted and delivered in a new entry.
	m = fresh()
	evil = m.peers[peerKey{session: 10}]
	code, err := m.oobArrive(now, oobArrival{session: 10, token: cookie(m), to: 20, seq: 1, nid: "n1", from: "a", n: Notify{Msg: []byte("1")}})
	require.Empty(t, code, "%v", err)
	p = m.peers[peerKey{session: 10}]
	require.NotSame(t, evil, p)
	require.Equal(t, uint64(1), p.received)
	require.False(t, m.tokenOK(p, evil.tokenIn[0]), "the third party's token was not carried over")

	// An entry the cookie's own handshake made keeps the cookie valid beside the token it
	// issued: a notify the peer sent under the cookie before that reply lands there.
	m = newPeerMachine(20, simCfg(), func() uint64 { tok++; return tok })
	rep = m.inbound(now, inboundHS{name: "a", session: 10, token: 5, proof: cookie(m), ctrl: true})
	require.Empty(t, rep.refuse, "%v", rep.err)
	require.NotEqual(t, cookie(m), rep.token, "the pair's token is not the cookie")
	mine := m.peers[peerKey{session: 10}]
	code, err = m.oobArrive(now, oobArrival{session: 10, token: cookie(m), to: 20, seq: 1, nid: "n1", from: "a", n: Notify{Msg: []byte("1")}})
	require.Empty(t, code, "%v", err)
	require.Same(t, mine, m.peers[peerKey{session: 10}], "the entry stays")
	require.Equal(t, uint64(1), mine.received)
	require.True(t, m.tokenOK(mine, rep.token))

	// Once the third party used its entry, the cookie no longer takes it.
	m = fresh()
	evil = m.peers[peerKey{session: 10}]
	code, err = m.oobArrive(now, oobArrival{session: 10, token: evil.tokenIn[0], to: 20, seq: 1, nid: "e1", from: "evil", n: Notify{Msg: []byte("e")}})
	require.Empty(t, code, "%v", err)
	code, err = m.oobArrive(now, oobArrival{session: 10, token: cookie(m), to: 20, seq: 2, nid: "n2", from: "a", n: Notify{Msg: []byte("2")}})
	require.Equal(t, refuseAuth, code)
	require.ErrorIs(t, err, ErrAuth)
	rep = m.inbound(now, inboundHS{name: "a", session: 10, token: 5, proof: cookie(m), ctrl: true})
	require.Equal(t, refuseAuth, rep.refuse)
	require.Same(t, evil, m.peers[peerKey{session: 10}])
}

// TestMachineIdempotentRetry: a caller retries a notify whose outcome it did not learn,
// with the same id; it is delivered once.
func TestMachineIdempotentRetry(t *testing.T) {
	n := newSimNet(t, 3)
	a := n.add("a", 10, simCfg())
	b := n.add("b", 20, simCfg())
	a.send("b", "x", "id-1")
	n.run()
	a.nextReq++
	a.posted[a.nextReq], a.nids[a.nextReq] = "x-again", "id-1"
	a.m.send(n.now, a.nextReq, "b", "id-1", n.now.Add(time.Hour), 0)
	a.perform()
	n.run()
	require.NoError(t, a.results[a.nextReq])
	require.Len(t, b.got, 1)
	require.Equal(t, uint64(1), b.m.peers[peerKey{session: 10}].win.stats.DuplicateIDs)
}

// TestMachineFenceOverHeldOOB: the receiver side of a sender whose OOB tries end before
// their answers (a 5 ms deadline towards a slow receiver): the copies come and are held
// behind a gap, and the sender, which gave their seqs up, fences a range that holds them.
// Every notify the receiver answers accepted must be delivered: the seqs a window ahead
// of the held ones too (the fence once marked their slots given up, and they were
// answered as duplicates, never delivered: TestContractRetrySameIDHeldCopies, tests/).
func TestMachineFenceOverHeldOOB(t *testing.T) {
	n := newSimNet(t, 5)
	cfg := simCfg()
	cfg.channels, cfg.window = false, 8
	a := n.add("a", 10, cfg)
	b := n.add("b", 20, cfg)
	a.send("b", "1", "w-1")                // the pair, and seq 1
	n.runWith(n.now.Add(time.Second), nil) // not so long that the entries are pruned
	require.Len(t, b.got, 1)
	tok := a.m.peers[peerKey{session: 20}].tokenOut
	require.NotZero(t, tok)
	arrive := func(seq uint64, id string) {
		t.Helper()
		msg := fmt.Sprintf("%s#%d", id, seq)
		code, err := b.m.oobArrive(n.now, oobArrival{session: 10, token: tok, to: 20, seq: seq, nid: id, from: "a", n: Notify{Msg: []byte(msg), ID: id}})
		b.perform()
		require.Empty(t, code, "seq %d: %v", seq, err)
		win := b.m.peers[peerKey{session: 10}].win
		held := seq >= win.next && win.slot(seq).state == slotHeld && win.slot(seq).id == id
		require.True(t, held || slices.ContainsFunc(b.got, func(g Notify) bool { return g.ID == id }),
			"seq %d (id %s) answered accepted: neither delivered nor held", seq, id)
	}
	// Seqs 3 and 5 come (held: 2 is missing); their tries ended at the sender, which gives
	// 2 to 5 up and fences them.
	arrive(3, "w-3")
	arrive(5, "w-5")
	code, err := b.m.oobArrive(n.now, oobArrival{session: 10, token: tok, to: 20, skipFrom: 2, skipN: 4})
	b.perform()
	require.Empty(t, code, "%v", err)
	// The retries, and later notifies, a window on.
	for seq := uint64(6); seq <= 5+uint64(cfg.window); seq++ {
		arrive(seq, "w-"+strconv.FormatUint(seq, 10))
	}
	win := b.m.peers[peerKey{session: 10}].win
	require.Zero(t, win.held)
	require.Len(t, b.got, 3+cfg.window, "delivered: %v", b.got)
	require.Zero(t, win.stats.Duplicates)
}

// TestMachineFenceOverHeldChannel is TestMachineFenceOverHeldOOB on a ctrl channel: the
// window is the pair's, whatever path its seqs and fences take.
func TestMachineFenceOverHeldChannel(t *testing.T) {
	n := newSimNet(t, 6)
	cfg := simCfg()
	cfg.window = 8
	a := n.add("a", 10, cfg)
	b := n.add("b", 20, cfg)
	a.send("b", "1", "w-1")
	n.runWith(n.now.Add(time.Second), nil)
	require.Len(t, b.got, 1)
	p := b.m.peers[peerKey{session: 10}]
	require.NotZero(t, p.ch, "no channel")
	arrive := func(seq uint64) {
		b.m.chanArrival(n.now, p.ch, seq, "", Notify{Msg: []byte(strconv.FormatUint(seq, 10))})
		b.perform()
	}
	arrive(3)
	arrive(5)
	b.m.chanFence(n.now, p.ch, 2, 4)
	b.perform()
	for seq := uint64(6); seq <= 5+uint64(cfg.window); seq++ {
		arrive(seq)
	}
	require.Zero(t, p.win.held)
	require.Len(t, b.got, 3+cfg.window, "delivered: %v", b.got)
	require.Zero(t, p.win.stats.Duplicates)
}

// TestMachineLimits: names, peers and channels are capped; a refused or unreachable peer
// leaves nothing behind.
func TestMachineLimits(t *testing.T) {
	n := newSimNet(t, 4)
	cfg := simCfg()
	cfg.maxNames, cfg.maxPeers, cfg.maxChannels = 3, 2, 1
	a := n.add("a", 10, cfg)
	n.add("b", 20, simCfg())
	n.add("c", 30, simCfg())
	for i := 0; i < 10; i++ {
		a.send(fmt.Sprintf("nowhere-%d", i), "x", "")
	}
	n.run()
	require.Empty(t, a.m.names, "unreachable names are forgotten")
	require.Empty(t, a.m.peers)
	ok := a.send("b", "1", "")
	n.run()
	require.NoError(t, a.results[ok])
	over := a.send("c", "2", "")
	n.run()
	require.ErrorIs(t, a.results[over], ErrLimit, "max_channels")
	// Inbound: a peer over max_peers is refused with the code "limit".
	for s := uint64(100); s < 104; s++ {
		a.m.inbound(n.now, inboundHS{name: "x" + strconv.Itoa(int(s)), session: s, token: 1, ctrl: false})
	}
	require.LessOrEqual(t, len(a.m.peers), 2)
	require.LessOrEqual(t, len(a.m.names), 3)
	// Idle peers without a channel are forgotten after peerIdle.
	n.now = n.now.Add(a.m.cfg.peerIdle + time.Second)
	a.m.tick(n.now)
	require.Len(t, a.m.peers, 1, "only the peer with a channel stays")
}

// TestMachineCancel: a send still waiting for its handshake is withdrawn (not delivered);
// one already posted is not.
func TestMachineCancel(t *testing.T) {
	n := newSimNet(t, 5)
	a := n.add("a", 10, simCfg())
	b := n.add("b", 20, simCfg())
	id := a.send("b", "w", "")
	require.True(t, a.m.cancel(n.now, id, errors.New("ctx done")))
	a.perform()
	require.ErrorIs(t, a.results[id], ErrTimeout)
	require.NotErrorIs(t, a.results[id], ErrMaybeDelivered)
	for n.step() {
	}
	id2 := a.send("b", "p", "")
	require.False(t, a.m.cancel(n.now, id2, errors.New("ctx done")), "posted: cannot be withdrawn")
	n.run()
	require.NoError(t, a.results[id2])
	require.Equal(t, []string{"p"}, func() (s []string) {
		for _, g := range b.got {
			s = append(s, string(g.Msg))
		}
		return
	}())
}

// TestMachineBogusHandshakeFlood: 1 100 handshakes from invented sessions naming channels
// nobody will use. At most maxUnconfirmed are accepted at a time (the rest are refused
// "busy" and leave no peer entry); the accepted ones expire after the connect timeout, and
// a real peer is served afterwards, while a peer that proves its pair is never refused.
func TestMachineBogusHandshakeFlood(t *testing.T) {
	n := newSimNet(t, 6)
	a := n.add("a", 10, simCfg())
	b := n.add("b", 20, simCfg())
	first := a.send("b", "before", "")
	n.run()
	require.NoError(t, a.results[first])
	busy := 0
	for s := uint64(1000); s < 2100; s++ {
		rep := b.m.inbound(n.now, inboundHS{name: "bogus", session: s, token: s, ctrl: true, epoch: 1})
		if rep.refuse == refuseBusy {
			busy++
			continue
		}
		require.NotZero(t, rep.ch)
		b.m.inboundUp(n.now, rep.ch, nil)
		b.links[rep.ch] = &simLink{local: b, id: rep.ch, dead: true} // its QPN exists nowhere
	}
	b.perform()
	require.Equal(t, 1100-b.m.cfg.maxUnconfirmed, busy)
	require.Equal(t, b.m.cfg.maxUnconfirmed, b.m.unconfirmed)
	require.LessOrEqual(t, len(b.m.peers), b.m.cfg.maxUnconfirmed+1, "refused handshakes leave nothing")
	// The known pair proves its token: served during the flood.
	during := a.send("b", "during", "")
	pa := a.m.peers[peerKey{session: 20}]
	a.m.connectName(n.now, a.m.names["b"], pa) // a reconnect while flooded
	a.perform()
	n.run() // time passes: the bogus channels expire
	require.NoError(t, a.results[during])
	require.Zero(t, b.m.unconfirmed)
	require.Equal(t, uint64(b.m.cfg.maxUnconfirmed), b.m.stats.UnconfirmedExpired)
	c := n.add("c", 30, simCfg())
	late := c.send("b", "after", "")
	n.run()
	require.NoError(t, c.results[late], "a new peer is served once the flood expired")
}

// FuzzMachineHostileInput: handshakes, OOB notifies and fences from a hostile client, chosen
// by the fuzzer, against an engine that also has a real peer. The machine never panics,
// keeps its peers, names and unconfirmed channels within their caps, delivers the real
// peer's notifies once and in order, and never delivers a forged one.
func FuzzMachineHostileInput(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
	f.Fuzz(func(t *testing.T, ops []byte) { hostileRun(t, ops, nil) })
}

// hostileRun runs FuzzMachineHostileInput's ops; trace (when not nil) sees each action of
// both engines.
func hostileRun(t *testing.T, ops []byte, trace func(string)) {
	n := newSimNet(t, 1)
	cfg := simCfg()
	cfg.maxPeers, cfg.maxNames, cfg.maxUnconfirmed = 8, 16, 4
	// As the engine's defaults are (60 s gap, 30 s sends), a gap outlives every send
	// that could fill it; a shorter one may deliver a very late seq out of order.
	cfg.gapTimeout = 2 * time.Hour
	a := n.add("a", 10, simCfg())
	b := n.add("b", 20, cfg)
	if trace != nil {
		a.trace = func(x mAction) { trace("a " + describeAction(x)) }
		b.trace = func(x mAction) { trace("b " + describeAction(x)) }
	}
	var order []reqID
	for i := 0; i+2 < len(ops); i += 3 {
		op, x, y := ops[i], uint64(ops[i+1]), uint64(ops[i+2])
		switch op % 5 {
		case 0:
			var from netip.Addr
			if op&16 != 0 {
				from = netip.AddrFrom4([4]byte{10, 0, 0, byte(y % 3)})
			}
			proof := y % 3
			if op&32 != 0 { // the cookie of a busy refusal, returned
				proof = b.m.cookie(x%12, fmt.Sprint("h", x%20))
			}
			rep := b.m.inbound(n.now, inboundHS{name: fmt.Sprint("h", x%20), session: x % 12, token: y, proof: proof, epoch: y % 4, ctrl: op&8 != 0, from: from})
			if rep.ch != 0 {
				b.m.inboundUp(n.now, rep.ch, nil)
				b.links[rep.ch] = &simLink{local: b, id: rep.ch, dead: true}
			}
		case 1:
			// Session 0 is a Mooncake engine's classic notify: unauthenticated by design
			// (WithOOBAuthKey closes that); any other session needs its pair's token.
			msg := "forged"
			if x%12 == 0 {
				msg = fmt.Sprint("legacy", i)
			}
			b.m.oobArrive(n.now, oobArrival{session: x % 12, token: y, seq: y, skipFrom: x, skipN: y % 5, n: Notify{Msg: []byte(msg)}})
		case 2:
			order = append(order, a.send("b", fmt.Sprint("real", len(order)), ""))
		case 3:
			for k := int(x % 8); k > 0 && n.step(); k-- {
			}
		case 4:
			n.now = n.now.Add(time.Duration(x) * 100 * time.Millisecond)
			b.m.tick(n.now)
		}
		b.perform()
		if len(b.m.peers) > cfg.maxPeers || len(b.m.names) > cfg.maxNames || b.m.unconfirmed > 2*cfg.maxUnconfirmed || b.m.unconfirmed < 0 {
			t.Fatalf("caps broken: %d peers, %d names, %d unconfirmed", len(b.m.peers), len(b.m.names), b.m.unconfirmed)
		}
		unconfirmed, byAddr := 0, map[netip.Addr]int{}
		for _, p := range b.m.peers {
			if !p.confirmed {
				unconfirmed++
				if p.from.IsValid() {
					byAddr[p.from]++
				}
			}
		}
		if unconfirmed != b.m.unconfirmedPeers || !maps.Equal(byAddr, b.m.unconfirmedBy) {
			t.Fatalf("unconfirmed peers counted %d %v, there are %d %v", b.m.unconfirmedPeers, b.m.unconfirmedBy, unconfirmed, byAddr)
		}
		unusedCounts(t, b.m)
	}
	n.run()
	seen := map[string]bool{}
	for _, g := range b.got {
		m := string(g.Msg)
		if m == "forged" {
			t.Fatal("a forged notify was delivered")
		}
		if seen[m] {
			t.Fatalf("%s delivered twice", m)
		}
		seen[m] = true
	}
	checkDelivery(t, a, b, order)
}

// TestMachineDeterministic: one input gives one sequence of actions. The machine's loops
// that act (tick, closeAll, hintPort, readvertised) visit its maps in a fixed order; with
// Go's random map order this input (a fuzz find: a hostile client fills the peer table and
// lets unconfirmed channels expire in one tick) gave different action sequences run to run,
// and failed one run in six.
func TestMachineDeterministic(t *testing.T) {
	ops := []byte("zcB\xed07X:c(72(\xf51\x19\xf08)19.Yc)x&a20)ax21X 78,27Z9\"207A12#a782&2~x'87ZXZy1x\xcd;8C(70$Xx#aY70&\xa31zY7C0\"Y10\xbc]72x90CZ0\x90C9ya1!2cZ20711908X7BxC8ZAZ\"8\xa122cBBb&2b,70gA0?0J7%0b9\xbd02bB")
	var first []string
	for run := 0; run < 10; run++ {
		var acts []string
		hostileRun(t, ops, func(s string) { acts = append(acts, s) })
		require.NotEmpty(t, acts)
		if run == 0 {
			first = acts
			continue
		}
		require.Equal(t, first, acts, "run %d acted otherwise than run 0", run)
	}
}

// describeAction writes x without pointers (an error by its text).
func describeAction(x mAction) string {
	e := ""
	if x.err != nil {
		e = x.err.Error()
	}
	return fmt.Sprintf("%d %q ch=%d req=%d seq=%d epoch=%d session=%d token=%d proof=%d fence=%d+%d pair=%d legacy=%v err=%q n=%s/%s/%q/%s at=%d deadline=%d",
		x.kind, x.name, x.ch, x.req, x.seq, x.epoch, x.session, x.token, x.proof, x.first, x.count, x.pair, x.legacy, e,
		x.n.Peer, x.n.Name, x.n.Msg, x.n.ID, x.at.UnixNano(), x.deadline.UnixNano())
}

// TestMachineConnectSlots: at most maxConnects handshakes run at once; the others wait in
// order for a slot, and every send is delivered.
func TestMachineConnectSlots(t *testing.T) {
	n := newSimNet(t, 8)
	cfg := simCfg()
	cfg.maxConnects = 2
	a := n.add("a", 10, cfg)
	var peers []*simEngine
	ids := map[string]reqID{}
	for i := 0; i < 6; i++ {
		name := fmt.Sprint("p", i)
		peers = append(peers, n.add(name, uint64(100+i), simCfg()))
		ids[name] = a.send(name, "to-"+name, "")
	}
	for n.step() {
		require.LessOrEqual(t, a.m.connects, 2)
	}
	n.run()
	for _, p := range peers {
		require.NoError(t, a.results[ids[p.name]], p.name)
		require.Len(t, p.got, 1)
	}
	require.Equal(t, uint64(4), a.m.stats.ConnectsQueued)
	require.Zero(t, a.m.connects)
}

// TestMachineChannelLimitKeepsNothing: a handshake refused for max_channels leaves no peer
// entry; its token is a cookie bound to the session and the name given. The first OOB
// notify that carries it (under that name) makes the entry; a wrong name or token does not.
// End to end, a peer over the limit is served over OOB, in order, under its own name.
func TestMachineChannelLimitKeepsNothing(t *testing.T) {
	n := newSimNet(t, 5)
	cfg := simCfg()
	cfg.maxChannels = 1
	a := n.add("a", 10, simCfg())
	b := n.add("b", 20, cfg)
	c := n.add("c", 30, simCfg())
	var order []reqID
	for i := 0; i < 3; i++ {
		order = append(order, a.send("b", strconv.Itoa(i), ""))
	}
	n.run()
	require.Equal(t, 3, checkDelivery(t, a, b, order))
	peers := len(b.m.peers)
	rep := b.m.inbound(n.now, inboundHS{name: "x", session: 77, token: 5, ctrl: true})
	require.Equal(t, refuseLimit, rep.refuse)
	require.ErrorIs(t, rep.err, ErrLimit)
	require.NotZero(t, rep.token)
	require.Len(t, b.m.peers, peers, "a refused handshake keeps nothing")
	for _, bad := range []oobArrival{
		{session: 77, token: rep.token, from: "y", seq: 1},     // another name
		{session: 78, token: rep.token, from: "x", seq: 1},     // another session
		{session: 77, token: rep.token ^ 1, from: "x", seq: 1}, // another token
	} {
		code, err := b.m.oobArrive(n.now, bad)
		require.Equal(t, refuseAuth, code)
		require.ErrorIs(t, err, ErrAuth)
		require.Len(t, b.m.peers, peers)
	}
	code, err := b.m.oobArrive(n.now, oobArrival{session: 77, token: rep.token, from: "x", seq: 1, n: Notify{Msg: []byte("cookie")}})
	require.Empty(t, code, "%v", err)
	require.Len(t, b.m.peers, peers+1)
	b.perform()
	require.Equal(t, "x", b.got[len(b.got)-1].Peer)

	order = order[:0]
	for i := 0; i < 5; i++ {
		order = append(order, c.send("b", "c"+strconv.Itoa(i), ""))
	}
	n.run()
	require.Equal(t, 5, checkDelivery(t, c, b, order), "served over OOB")
	require.Equal(t, "c", b.got[len(b.got)-1].Peer)
}

// TestMachineOOBSimultaneousOpen: two OOB-only engines start sending to each other at
// once. A notify may meet the peer before the peer knows the token it carries (refused:
// auth), which rebinds the pair and gives that seq up; the fence for it must reach the
// peer once the new handshake gives a path, or everything after it waits for the gap.
func TestMachineOOBSimultaneousOpen(t *testing.T) {
	cfg := simCfg()
	cfg.channels = false
	rebinds := 0
	for seed := uint64(0); seed < 300; seed++ {
		n := newSimNet(t, seed)
		a := n.add("a", 10, cfg)
		b := n.add("b", 20, cfg)
		var ab, ba []reqID
		for i := 0; i < 5; i++ {
			ab = append(ab, a.send("b", "ab"+strconv.Itoa(i), ""))
			ba = append(ba, b.send("a", "ba"+strconv.Itoa(i), ""))
		}
		n.run()
		require.Equal(t, 5, checkDelivery(t, a, b, ab), "seed %d: a→b", seed)
		require.Equal(t, 5, checkDelivery(t, b, a, ba), "seed %d: b→a", seed)
		for _, e := range []*simEngine{a, b} {
			for _, p := range e.m.peers {
				require.Zero(t, p.win.held, "seed %d: %s holds notifies behind a gap", seed, e.name)
			}
		}
		rebinds += int(a.m.stats.AuthRefused + b.m.stats.AuthRefused)
	}
	t.Logf("auth refusals across 300 schedules: %d", rebinds)
}

// TestMachineOfferedTokenNotForAnotherSession: the token of a handshake still in flight
// opens only a session the engine does not know yet or the one its name already leads to;
// the engine at that name cannot use it to inject into another peer's pair.
func TestMachineOfferedTokenNotForAnotherSession(t *testing.T) {
	n := newSimNet(t, 9)
	a := n.add("a", 10, simCfg())
	n.add("b", 20, simCfg())
	c := n.add("c", 30, simCfg())
	order := []reqID{a.send("c", "c0", "")}
	n.run()
	require.Equal(t, 1, checkDelivery(t, a, c, order))
	a.send("b", "b0", "") // a's handshake to b is now in flight: its token is offered
	require.Len(t, a.m.offered, 1)
	var tok uint64
	for k := range a.m.offered {
		tok = k
	}
	code, err := a.m.oobArrive(n.now, oobArrival{session: 30, token: tok, to: 10, seq: 2, from: "b",
		n: Notify{Msg: []byte("forged")}})
	require.Equal(t, refuseAuth, code)
	require.ErrorIs(t, err, ErrAuth)
	a.perform()
	for _, g := range a.got {
		require.NotEqual(t, "forged", string(g.Msg))
	}
	// From the session that answers it, the token is good at once.
	code, err = a.m.oobArrive(n.now, oobArrival{session: 20, token: tok, to: 10, seq: 1, from: "b",
		n: Notify{Msg: []byte("early")}})
	require.Empty(t, code, "%v", err)
	n.run()
	require.Equal(t, "early", string(a.got[len(a.got)-1].Msg))
}

// TestMachineCloseAllUnknownForInFlight: closing the engine fails every send, but only a
// send that never left is "not delivered"; one posted on a channel (or written over OOB)
// may have landed, and its error says so (ErrMaybeDelivered).
func TestMachineCloseAllUnknownForInFlight(t *testing.T) {
	for _, oobOnly := range []bool{false, true} {
		cfg := simCfg()
		cfg.channels = !oobOnly
		n := newSimNet(t, 11)
		a := n.add("a", 10, cfg)
		n.add("b", 20, cfg)
		warm := a.send("b", "warm", "")
		for n.step() { // no idle time passes: the pair stays known
		}
		require.NoError(t, a.results[warm])
		onWay := a.send("b", "on its way", "") // posted (or sent over OOB); the network has not moved
		waiting := a.send("nobody", "waits for a handshake", "")
		a.m.closeAll(sendErr(ErrClosed, "a", "", nil, false))
		a.perform()
		require.ErrorIs(t, a.results[onWay], ErrClosed, "oobOnly %v", oobOnly)
		require.ErrorIs(t, a.results[onWay], ErrMaybeDelivered, "oobOnly %v", oobOnly)
		require.ErrorIs(t, a.results[waiting], ErrClosed)
		require.NotErrorIs(t, a.results[waiting], ErrMaybeDelivered)
	}
}

// TestMachineUnknownNameHoldsItsPortOnly: a send to a known peer waits behind an older send
// to a name whose first handshake is on its way, when that name may be the peer's (its
// port), and is delivered after it; a name of another port holds nothing; a handshake
// that fails releases what waited behind it.
func TestMachineUnknownNameHoldsItsPortOnly(t *testing.T) {
	n := newSimNet(t, 1)
	a := n.add("a", 10, simCfg())
	b := n.add("b", 20, simCfg(), "localhost:b", "127.0.0.1:b")
	n.add("c", 30, simCfg(), "127.0.0.1:c")
	first := a.send("127.0.0.1:b", "first", "")
	n.run()
	require.NoError(t, a.results[first])
	p := a.m.names["127.0.0.1:b"].peer
	require.NotNil(t, p)

	// Another name with b's port: b's next send waits for that name's handshake.
	x := a.send("localhost:b", "x", "")
	y := a.send("127.0.0.1:b", "y", "")
	require.Equal(t, []reqID{y}, p.waiters, "y waits behind x, whose name may be b's")
	// A name of another port holds nothing.
	z := a.send("127.0.0.1:c", "z", "")
	w := a.send("127.0.0.1:b", "w", "")
	require.Equal(t, []reqID{y, w}, p.waiters, "still behind x")
	n.run()
	require.Equal(t, 4, checkDelivery(t, a, b, []reqID{first, x, y, w}))
	require.NoError(t, a.results[z])

	// A name of b's port nobody answers: its handshake fails, what waited behind it goes.
	q1 := a.send("10.9.9.9:b", "q1", "")
	q2 := a.send("127.0.0.1:b", "q2", "")
	require.Equal(t, []reqID{q2}, p.waiters)
	n.run()
	require.ErrorIs(t, a.results[q1], ErrPeerUnreachable)
	require.NoError(t, a.results[q2])
	require.Equal(t, "q2", string(b.got[len(b.got)-1].Msg))

	// A name of another port: the peer's sends do not wait for it.
	r1 := a.send("127.0.0.1:d", "r1", "")
	r2 := a.send("127.0.0.1:b", "r2", "")
	require.Empty(t, p.waiters, "r2 posted at once")
	n.run()
	require.Error(t, a.results[r1])
	require.NoError(t, a.results[r2])
}
