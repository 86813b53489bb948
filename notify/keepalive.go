package notify

import (
	"fmt"
	"time"

	"github.com/twosided/twosided/ctrlchannel"
)

// keepalive probes idle channels each interval (WithKeepalive) so a dead peer is found
// without traffic: RC retry exhaustion on the probe's SEND closes the channel. The timer
// runs only while channels exist, so an engine without channels never wakes. Loop-only.
type keepalive struct {
	timer   *timerHandle
	last    time.Time               // when the previous round ran
	starved map[chanID]*starveState // channels at their credit reserve
}

// timerHandle is the part of a reactor timer the keepalive uses.
type timerHandle interface{ Stop() bool }

func (k *keepalive) stop() {
	if k.timer != nil {
		(*k.timer).Stop()
		k.timer = nil
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

// armKeepalive starts the keepalive timer if it is on and not running. Loop-only.
func (e *Engine) armKeepalive() {
	if e.cfg.keepalive == 0 || e.ka.timer != nil || e.closing || len(e.chans) == 0 {
		return
	}
	var t timerHandle = e.loop.AfterFunc(e.cfg.keepalive, e.keepaliveRound)
	e.ka.timer = &t
}

func (e *Engine) keepaliveRound() {
	e.ka.timer = nil
	if e.closing {
		return
	}
	now := e.loop.Now()
	late := !e.ka.last.IsZero() && now.Sub(e.ka.last) > 2*e.cfg.keepalive
	e.ka.last = now
	if e.ka.starved == nil {
		e.ka.starved = make(map[chanID]*starveState)
	}
	for id := range e.ka.starved {
		if e.chans[id] == nil {
			delete(e.ka.starved, id)
		}
	}
	for id, ch := range e.chans {
		ch.Keepalive()
		if e.chans[id] == nil { // a synchronous failure closed it
			continue
		}
		st := e.ka.starved[id]
		if st == nil {
			st = &starveState{}
			e.ka.starved[id] = st
		}
		if st.round(now, ch.Stats().KeepalivesNoCredit, e.cfg.keepalive, late) {
			ch.Close(fmt.Errorf("%w: no credit returned for %v: %w", ErrPeerDead, now.Sub(st.since), ctrlchannel.ErrPeerError))
		}
	}
	e.armKeepalive()
}
