package notify

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/oob"
)

// TestMachineHandshakeReplyCutThenOtherName: a sender's handshake reaches an OOB-only
// receiver, which makes the pair and issues a token, but the reply is lost (the connection
// is cut); the sender's next handshake, by another name of the receiver, must still make a
// pair both ends agree on: its notifies over OOB are taken, and later handshakes are not
// refused for want of proof.
func TestMachineHandshakeReplyCutThenOtherName(t *testing.T) {
	now := time.Unix(1000, 0)
	cfg := simCfg()
	cfg.fallback = true
	s, skinds := directMachine(cfg)
	rcfg := simCfg()
	rcfg.channels = false
	rtok := uint64(500)
	r := newPeerMachine(20, rcfg, func() uint64 { rtok++; return rtok })
	hsOf := func(a mAction) inboundHS {
		return inboundHS{name: "127.0.0.1:9", session: 10, token: a.token, proof: a.proof, epoch: a.epoch, ctrl: a.ch != 0}
	}
	resOf := func(rep inboundReply) hsResult {
		res := hsResult{session: 20, token: rep.token, refuse: rep.refuse, epoch: rep.epoch, peerName: "127.0.0.1:7", fresh: rep.fresh}
		if rep.refuse != "" && rep.err != nil {
			res.refuseMsg = rep.err.Error()
		}
		return res
	}
	const x, y = "127.0.0.1:7", "localhost:7"
	s.send(now, 1, x, "", now.Add(time.Hour), 0)
	c := skinds(aConnect)
	require.Len(t, c, 1)
	rep := r.inbound(now, hsOf(c[0]))
	t.Logf("first handshake: %+v (its reply is cut)", rep)
	lost := &kindError{kind: ErrPeerUnreachable, cause: fmt.Errorf("%w: %s: connection closed by peer", oob.ErrPeerUnreachable, x)}
	s.connected(now, x, c[0].ch, hsResult{err: lost})
	skinds(aComplete)

	now = now.Add(10 * time.Millisecond)
	s.send(now, 2, y, "", now.Add(time.Hour), 0)
	c = skinds(aConnect)
	require.Len(t, c, 1)
	rep = r.inbound(now, hsOf(c[0]))
	t.Logf("second handshake: %+v", rep)
	require.NotEqual(t, refuseAuth, rep.refuse)
	s.connected(now, y, c[0].ch, resOf(rep))
	acts := s.ready()
	for _, a := range acts {
		t.Logf("sender: %+v", a)
	}
	for round := 0; round < 5; round++ {
		now = now.Add(time.Second)
		s.send(now, reqID(3+round), x, "", now.Add(time.Hour), 0)
		s.tick(now)
		for _, a := range s.ready() {
			switch a.kind {
			case aConnect:
				rep := r.inbound(now, hsOf(a))
				require.NotEqual(t, refuseAuth, rep.refuse, "round %d: the receiver refuses the sender's proof: %v", round, rep.err)
				s.connected(now, a.name, a.ch, resOf(rep))
			case aOOB:
				code, err := r.oobArrive(now, oobArrival{session: 10, token: a.token, to: a.session, seq: a.seq, from: "127.0.0.1:9", n: Notify{Name: "n"}})
				require.Empty(t, code, "round %d: the receiver refused a notify: %v", round, err)
				s.sendResult(now, a.req, nil, false, false)
			case aComplete:
				require.NoError(t, a.err, "round %d", round)
			}
		}
	}
}
