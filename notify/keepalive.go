package notify

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"time"

	"github.com/twosided/twosided/oob"

	"github.com/twosided/twosided/ctrlchannel"
	"github.com/twosided/twosided/reactor"
)

// keepalive probes idle channels each interval (WithKeepalive) so a dead peer is found
// without traffic: RC retry exhaustion on the probe's SEND closes the channel. The timer
// runs only while channels exist, so an engine without channels never wakes. Loop-only.
type keepalive struct {
	timer   *reactor.Timer // made once, then Reset: arming allocates nothing
	armed   bool
	last    time.Time               // when the previous round ran
	starved map[chanID]*starveState // channels at their credit reserve

	deadByProbe, deadNoCredit uint64 // Stats.DeadByProbe, Stats.DeadNoCredit
}

func (k *keepalive) stop() {
	if k.armed {
		k.timer.Stop()
		k.armed = false
	}
}

// starveState decides when a channel that cannot probe (no credit for a keepalive) means a
// dead peer. Pure: a peer whose loop stalls returns no credit for a while and is alive (its
// NIC still acknowledges), so starvation alone declares death only after starveDeadAfter of
// it, measured in rounds that ran on time: a round that comes late (our own loop stalled)
// restarts the count, since the peer had no chance to answer meanwhile.
type starveState struct {
	noCredit uint64    // the channel's KeepalivesNoCredit at the last round
	since    time.Time // first round of the current starvation; zero: not starved
	probing  bool      // an OOB probe of the peer is in flight
}

// dryStep reports, given whether the channel was found dry at this half-step — no credit
// beyond the reserve, no SEND on the wire, sends waiting — whether its peer is probed over
// OOB now: at every dry half-step, one probe at a time. A dry channel sends nothing whose
// failure would reveal a dead peer, and its keepalive needs credit too; an OOB probe needs
// none and is answered by the peer's OOB listener even while its receive queue is full
// (probeFinding reads the answer). A live peer in a lull of credit costs one small OOB
// request per half-step. Pure: whether the peer's frames arrived meanwhile does not matter
// (a paused peer still sends keepalives of its own until it dies).
func (s *starveState) dryStep(dry bool) bool {
	return dry && !s.probing
}

// probeFinding reads the answer to an OOB probe (a notify with neither seq nor fence that
// carries the pair's session, token and the session we believe the peer runs): a reason
// to declare the channel's peer dead, or "" when the answer proves nothing. Dead: nobody
// listens at the peer's address (the connection is refused: its process is gone), the
// engine there does not hold the pair (ErrAuth: it restarted, or forgot the pair), or it is
// closing. An answer means the same engine is alive (a receiver applying backpressure);
// a timeout, a busy or broken connection says nothing, and the no-credit rule still applies.
func probeFinding(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, syscall.ECONNREFUSED):
		return "nobody listens at its OOB address any more"
	case errors.Is(err, oob.ErrAuth):
		return "the engine at its OOB address does not hold the pair (it restarted)"
	case errors.Is(err, oob.ErrPeerClosed):
		return "its OOB listener says it is closing"
	}
	return ""
}

// starveDeadAfter is how long a channel may sit without credit before its peer is declared
// dead, at least: a live peer's loop pauses far less (a 700 ms stall is common under load).
const starveDeadAfter = 5 * time.Second

// round reports whether the channel's peer is to be declared dead at now, given the
// channel's KeepalivesNoCredit counter, the round interval and whether this round ran late.
func (s *starveState) round(now time.Time, noCredit uint64, interval time.Duration, late bool) bool {
	starvedNow := noCredit > s.noCredit
	s.noCredit = noCredit
	if !starvedNow || late {
		s.since = time.Time{}
		return false
	}
	if s.since.IsZero() {
		s.since = now
		return false
	}
	return now.Sub(s.since) >= max(starveDeadAfter, 3*interval)
}

// stallProbe is the keepalive period while keepalive is off but sends wait on a channel:
// a channel whose peer closed its QP (its side failed while the link was down) returns no
// credit and, with nothing in flight, no completion error either; probing finds it.
const stallProbe = time.Second

func (e *Engine) keepaliveInterval() time.Duration {
	if e.cfg.keepalive > 0 {
		return e.cfg.keepalive
	}
	return stallProbe
}

// probed reports whether channel id is probed this round: every channel with keepalive on,
// else only channels with sends waiting on them.
func (e *Engine) probed(id chanID) bool {
	if e.cfg.keepalive > 0 {
		return true
	}
	ce := e.m.chans[id]
	return ce != nil && ce.peer != nil && ce.peer.ch == id && ce.peer.inflight > 0
}

// armKeepalive starts the keepalive timer if it is not running and a channel needs it: any
// channel with keepalive on; with it off, a channel with sends waiting. An idle engine
// arms nothing. Loop-only.
func (e *Engine) armKeepalive() {
	if e.ka.armed || e.closing || len(e.chans) == 0 {
		return
	}
	if e.cfg.keepalive == 0 {
		need := false
		for id := range e.chans {
			if e.probed(id) {
				need = true
				break
			}
		}
		if !need {
			return
		}
	}
	d := untilNextStep(time.Now(), e.keepaliveInterval()/2)
	if e.ka.timer == nil {
		e.ka.timer = e.loop.AfterFunc(d, e.keepaliveRound)
	} else {
		e.ka.timer.Reset(d)
	}
	e.ka.armed = true
}

// Keepalive rounds run on a wall-clock grid of half-intervals, the same for every engine,
// and each channel is probed at one of the two half-steps of its interval: the side with
// the lower session at the even step, the other at the odd one. So the two ends of a
// channel do not both probe it (each hears the other's frame before its own round and
// skips; normally the lower session's end probes, and a late round can hand the task to the
// other end), and the probes of all of an engine's peers, whatever their number, arrive in
// two bursts per interval: an idle hub wakes a few times per interval, not once per peer
// (BenchmarkIdlePeers). Clocks that disagree by a few milliseconds only spread a burst.

// untilNextStep is the time from now to the next multiple of step on the wall clock.
func untilNextStep(now time.Time, step time.Duration) time.Duration {
	if step <= 0 {
		return time.Millisecond
	}
	d := step - time.Duration(now.UnixNano()%int64(step))
	return max(d, time.Millisecond)
}

// stepParity is which half-step of the grid the wall-clock time now falls on (0 or 1).
func stepParity(now time.Time, step time.Duration) int {
	if step <= 0 {
		return 0
	}
	// Rounded to the nearest step: a timer fires a little after its grid point.
	return int(((now.UnixNano() + int64(step)/2) / int64(step)) % 2)
}

// keepaliveParity is the half-step at which this engine probes channel id: 0 when its
// session is the lower of the pair's.
func (e *Engine) keepaliveParity(id chanID) int {
	if ce := e.m.chans[id]; ce != nil && ce.peer != nil && e.session < ce.peer.key.session {
		return 0
	}
	return 1
}

func (e *Engine) keepaliveRound() {
	e.ka.armed = false
	if e.closing {
		return
	}
	now := e.loop.Now()
	interval := e.keepaliveInterval()
	late := !e.ka.last.IsZero() && now.Sub(e.ka.last) > interval // two half-steps
	e.ka.last = now
	parity := stepParity(time.Now(), interval/2)
	if e.ka.starved == nil {
		e.ka.starved = make(map[chanID]*starveState)
	}
	for id := range e.ka.starved {
		if e.chans[id] == nil {
			delete(e.ka.starved, id)
		}
	}
	for id, ch := range e.chans {
		if !e.probed(id) {
			delete(e.ka.starved, id)
			continue
		}
		st := e.ka.starved[id]
		if st == nil {
			st = &starveState{}
			e.ka.starved[id] = st
		}
		if e.keepaliveParity(id) == parity { // else its half-step is the other one
			ch.Keepalive()
			if e.chans[id] == nil { // a synchronous failure closed it
				continue
			}
			if st.round(now, ch.Stats().KeepalivesNoCredit, interval, late) {
				e.ka.deadNoCredit++
				ch.Close(fmt.Errorf("%w: no credit returned for %v: %w", ErrPeerDead, now.Sub(st.since), ctrlchannel.ErrPeerError))
				continue
			}
		}
		// At every half-step, whichever end's round it is: the OOB probe is ours alone.
		if st.dryStep(e.dry(id, ch)) {
			e.probePeer(id, st, interval/2)
		}
	}
	e.armKeepalive()
}

// dry reports whether channel id is dry (starveState.dryStep): sends of its peer wait on
// it, no SEND is on the wire and no credit is left but the reserve kept for credit frames.
// Loop-only.
func (e *Engine) dry(id chanID, ch *ctrlchannel.Channel) bool {
	ce := e.m.chans[id]
	if ce == nil || ce.peer == nil || ce.peer.ch != id || (ce.peer.inflight == 0 && len(ce.peer.waiters) == 0) {
		return false
	}
	cs := ch.Stats()
	return cs.InFlight == 0 && cs.CreditAvail <= 1
}

// literalName is one of p's names that is a literal address (its first such name, else
// the name it advertised when that is one), or "" when it has none: a peer sent to as
// "localhost:P" and "127.0.0.1:P" is probed at the latter, whatever name came first.
func literalName(p *peerEntry) string {
	for _, n := range p.names {
		if _, err := netip.ParseAddrPort(n); err == nil {
			return n
		}
	}
	if _, err := netip.ParseAddrPort(p.adv); err == nil {
		return p.adv
	}
	return ""
}

// probePeer sends the OOB probe of a channel without credit (starveState.probeDue) and
// closes the channel when its answer shows the peer dead (probeFinding). The probe is a
// notify with neither seq nor fence: the peer delivers nothing, answers at once even while
// its receive queue is full, and refuses it (ErrAuth) when it is not the engine the pair
// was made with. Only a twosided peer with a literal address among its names is probed;
// others keep the no-credit rule alone. Loop-only.
func (e *Engine) probePeer(id chanID, st *starveState, timeout time.Duration) {
	ce := e.m.chans[id]
	if ce == nil || ce.peer == nil || ce.peer.ch != id || ce.peer.key.session == 0 || ce.peer.tokenOut == 0 {
		return
	}
	p := ce.peer
	name := literalName(p)
	if name == "" {
		return // a host name would block the loop to resolve
	}
	req := &oob.NotifyRequest{From: e.name, Session: e.session, Token: p.tokenOut, To: p.key.session}
	st.probing = true
	done := func(err error) {
		st.probing = false
		why := probeFinding(err)
		ch := e.chans[id]
		if why == "" || ch == nil || e.ka.starved[id] != st || e.closing {
			return
		}
		e.ka.deadByProbe++
		ch.Close(fmt.Errorf("%w: %s: %w", ErrPeerDead, why, ctrlchannel.ErrPeerError))
		e.perform()
	}
	if err := e.node.NotifyOnLoop(name, req, timeout, done); err != nil {
		done(err)
	}
}
