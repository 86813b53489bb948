package notify

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/oob"
)

// A channel made off the loop is adopted only while the machine still wants it: our own
// handshake's channel until the engine closes, a peer's until its unconfirmed channel
// expires (its worker took longer than the connect timeout); the driver then releases it,
// and the refusal it answers with forgets the entry.
func TestMachineChanWanted(t *testing.T) {
	now := time.Unix(1000, 0)
	t.Run("ours", func(t *testing.T) {
		m, kinds := directMachine(simCfg())
		m.send(now, 1, "b", "", now.Add(time.Hour), 0)
		acts := kinds(aConnect)
		require.Len(t, acts, 1)
		id := acts[0].ch
		require.NotZero(t, id)
		require.True(t, m.chanWanted(id))
		require.False(t, m.chanWanted(0), "a session handshake has no channel")
		m.closeAll(ErrClosed)
		require.False(t, m.chanWanted(id))
	})
	t.Run("peer's", func(t *testing.T) {
		m, _ := directMachine(simCfg())
		dec := m.inbound(now, inboundHS{name: "b", session: 20, token: 5, epoch: 1, ctrl: true})
		require.Empty(t, dec.refuse)
		require.NotZero(t, dec.ch)
		require.True(t, m.chanWanted(dec.ch))
		m.tick(now.Add(m.cfg.connectTimeout - time.Millisecond))
		require.True(t, m.chanWanted(dec.ch), "within the connect timeout")
		m.tick(now.Add(m.cfg.connectTimeout))
		require.False(t, m.chanWanted(dec.ch), "an unconfirmed channel past the connect timeout")
		m.inboundFailed(now.Add(m.cfg.connectTimeout), dec.ch, dec.fresh, inboundHS{name: "b", session: 20})
		require.Nil(t, m.chans[dec.ch], "the refusal forgets the entry")
		require.Zero(t, m.channels)
	})
}

func TestReplyHasChannel(t *testing.T) {
	for _, tc := range []struct {
		name string
		resp *oob.HandshakeDesc
		err  error
		want bool
	}{
		{"channel", &oob.HandshakeDesc{CtrlChannel: true, NotifyQPNum: 7}, nil, true},
		{"no qp", &oob.HandshakeDesc{CtrlChannel: true}, nil, false},
		{"no ctrl channel", &oob.HandshakeDesc{NotifyQPNum: 7}, nil, false},
		{"refused", &oob.HandshakeDesc{CtrlChannel: true, NotifyQPNum: 7}, &oob.RefusedError{Code: oob.RefuseLimit}, false},
		{"no reply", nil, nil, false},
	} {
		require.Equal(t, tc.want, replyHasChannel(tc.resp, tc.err), tc.name)
	}
}

// Closing the device waits for the channels being made and ends their handshakes; past its
// bound the last worker closes the device when it is done, never before.
func TestConnectWorkersStopAndWait(t *testing.T) {
	var w connectWorkers
	ran := 0
	require.True(t, w.stopAndWait(time.Hour, func() { ran++ }), "none in flight")
	require.Equal(t, 1, ran)

	w = connectWorkers{}
	ctx := w.add()
	require.False(t, w.stopAndWait(0, func() { ran++ }), "one in flight past the bound")
	require.Error(t, ctx.Err(), "the workers' handshakes are ended")
	require.Equal(t, 1, ran, "the device is not closed under a worker")
	w.done()
	require.Equal(t, 2, ran, "the last worker closes it")

	w = connectWorkers{}
	w.add()
	done := make(chan bool)
	go func() { done <- w.stopAndWait(time.Hour, func() { ran++ }) }()
	require.Eventually(t, func() bool { w.mu.Lock(); defer w.mu.Unlock(); return w.idle != nil }, bounded, time.Millisecond)
	w.done()
	require.True(t, <-done)
	require.Equal(t, 3, ran)
}

// A handshake the peer's OOB node sheds (its pending handshakes at their bound) backs off
// and is tried again: a send whose deadline allows waits for the next handshake, one whose
// deadline comes first fails now; it is no Mooncake engine's "no ctrl channel".
func TestMachineConnectShed(t *testing.T) {
	now := time.Unix(1000, 0)
	cfg := simCfg()
	cfg.fallback = false
	m, kinds := directMachine(cfg)
	m.send(now, 1, "b", "", now.Add(time.Hour), 0)
	m.send(now, 2, "b", "", now.Add(10*time.Millisecond), 0)
	acts := kinds(aConnect)
	require.Len(t, acts, 1)
	m.connectShed(now, "b", acts[0].ch, ErrLimit, errors.New("too many pending handshakes"))
	var failed []reqID
	for _, a := range m.ready() {
		require.NotEqual(t, aConnect, a.kind, "no handshake before the backoff")
		if a.kind == aComplete {
			require.ErrorIs(t, a.err, ErrLimit)
			failed = append(failed, a.req)
		}
	}
	require.Equal(t, []reqID{2}, failed, "only the send whose deadline is before the next handshake fails")
	require.Equal(t, uint64(1), m.stats.HandshakesFailed)
	require.Zero(t, m.connects)
	m.tick(now.Add(connectBackoffMin))
	require.Len(t, kinds(aConnect), 1, "the handshake is tried again after the backoff")
}
