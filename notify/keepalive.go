package notify

import (
	"errors"
	"fmt"

	"github.com/twosided/twosided/ctrlchannel"
)

// ErrPeerDead: keepalives found the peer gone.
var ErrPeerDead = errors.New("notify: peer dead")

// starvedRounds is how many keepalive rounds a channel may sit without the credit for one
// before the peer is declared dead: a live, unpaused peer returns credit well before that.
const starvedRounds = 3

// armKeepalive starts the keepalive timer if it is on and not running. It runs only while
// channels exist, so an engine without channels never wakes. Loop-only.
func (e *Engine) armKeepalive() {
	if e.cfg.keepalive == 0 || e.kaTimer != nil || e.closing {
		return
	}
	e.kaTimer = e.loop.AfterFunc(e.cfg.keepalive, e.keepaliveRound)
}

func (e *Engine) keepaliveRound() {
	e.kaTimer = nil
	if e.closing {
		return
	}
	live := 0
	for _, p := range e.peers {
		if p.ch == nil {
			continue
		}
		live++
		p.ch.Keepalive()
		if p.ch == nil { // a synchronous failure closed it
			continue
		}
		st := p.ch.Stats()
		if st.KeepalivesNoCredit > p.noCredit {
			p.starved++
		} else {
			p.starved = 0
		}
		p.noCredit = st.KeepalivesNoCredit
		if p.starved >= starvedRounds {
			p.ch.Close(fmt.Errorf("%w: %s returned no credit for %d keepalive rounds: %w", ErrPeerDead, p.name, p.starved, ctrlchannel.ErrPeerError))
		}
	}
	if live > 0 {
		e.armKeepalive()
	}
}
