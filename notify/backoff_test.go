package notify

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A peer whose handshakes all fail (its port refuses) while the application sends every
// 10 ms for a minute, each send with a 5 s deadline: the handshakes back off (100 ms
// doubling to 8 s, jittered), so the peer sees about 20 of them, not 6 000; sends that
// can wait for the next handshake wait (64 at most), the others fail at once with the
// last failure, never maybe-delivered; a success resets the backoff.
func TestConnectBackoff(t *testing.T) {
	for _, channels := range []bool{true, false} {
		m, _ := directMachine(machineConfig{channels: channels, fallback: true})
		now := time.Unix(1000, 0)
		connects, completed, failed := 0, 0, 0
		var timerAt time.Time
		pending := map[reqID]bool{}
		drive := func() {
			for {
				acts := m.ready()
				if len(acts) == 0 {
					return
				}
				for _, a := range acts {
					switch a.kind {
					case aConnect:
						connects++
						// The peer is down: the handshake fails at once.
						m.connected(now, a.name, a.ch, hsResult{err: &kindError{kind: ErrPeerUnreachable, cause: errors.New("connect: connection refused")}})
					case aComplete:
						require.True(t, pending[a.req], "a send completed twice or unknown")
						delete(pending, a.req)
						completed++
						require.Error(t, a.err)
						require.NotErrorIs(t, a.err, ErrMaybeDelivered, "nothing was sent")
						// The handshake's failure, or: 64 sends already wait for the next one,
						// or the deadline passed while waiting for it.
						if !errors.Is(a.err, ErrPeerUnreachable) && !errors.Is(a.err, ErrBackpressure) && !errors.Is(a.err, ErrTimeout) {
							t.Fatalf("send failed with %v", a.err)
						}
						failed++
					case aClose:
						m.chanClosed(now, a.ch, a.err)
					case aTimer:
						timerAt = a.at
					}
				}
			}
		}
		id := reqID(0)
		end := now.Add(time.Minute)
		for now.Before(end) {
			id++
			pending[id] = true
			m.send(now, id, "peer:1", "", now.Add(5*time.Second), 10)
			drive()
			next := now.Add(10 * time.Millisecond)
			for !timerAt.IsZero() && !timerAt.After(next) {
				now = timerAt
				timerAt = time.Time{}
				m.tick(now)
				drive()
			}
			now = next
		}
		t.Logf("channels %v: 6000 sends in a minute to a dead peer: %d handshakes, %d failed sends, %d refused at once in backoff",
			channels, connects, failed, m.stats.BackoffRefused)
		require.LessOrEqual(t, connects, 20, "handshakes to a dead peer in a minute")
		require.GreaterOrEqual(t, connects, 8, "the backoff stops growing at 8 s")
		require.Equal(t, uint64(connects), m.stats.HandshakesFailed)

		// The peer is back: the next handshake succeeds and the backoff is over.
		ne := m.names["peer:1"]
		require.NotNil(t, ne)
		require.Positive(t, ne.failures)
		m.handshakeOK(ne)
		require.Zero(t, ne.failures)
	}
}
