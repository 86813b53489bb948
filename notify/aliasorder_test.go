package notify

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestAsyncStreamOverTwoNamesInOrder: a sender's SendNotifyAsync stream alternates two names
// of one receiver engine ("127.0.0.1:P" and "localhost:P"), from the first send on, so the
// sends under each name start before either handshake has told that both names are one
// engine (or, every other round, once the first name is bound and before the second is).
// The receiver gets every notify once, in the order of the sends, whatever name each went
// to: one pair of engines, one order. Each round is a new sender engine (a new pair).
func TestAsyncStreamOverTwoNamesInOrder(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for _, tr := range []string{TransportOOB, TransportRDMATwoSided} {
		t.Run(tr, func(t *testing.T) {
			late, total := aliasStream(t, tr, 6, 400)
			require.Zero(t, late, "%s: %d of %d notifies delivered after a later one", tr, late, total)
		})
	}
}

// aliasStream runs rounds of n async sends alternating two names of one receiver and
// returns how many were delivered after a notify sent later (late), of all delivered.
func aliasStream(t *testing.T, tr string, rounds, n int) (late, total int) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var mu sync.Mutex
	got := map[uint32][]uint32{} // round -> indices in delivery order
	arrived := sync.NewCond(&mu)
	recv, err := New(WithTransport(tr), WithHandler(func(d Notify) {
		mu.Lock()
		r := binary.BigEndian.Uint32(d.Msg)
		got[r] = append(got[r], binary.BigEndian.Uint32(d.Msg[4:]))
		arrived.Broadcast()
		mu.Unlock()
	}))
	require.NoError(t, err)
	defer closeEngine(t, recv)
	_, port, err := net.SplitHostPort(recv.Addr())
	require.NoError(t, err)
	names := []string{"127.0.0.1:" + port, "localhost:" + port}

	for r := 0; r < rounds; r++ {
		send, err := New(WithTransport(tr), WithMaxPendingSends(4096))
		require.NoError(t, err)
		closed := false
		defer func() {
			if !closed {
				closeEngine(t, send)
			}
		}()
		results := make(chan error, n)
		for i := 0; i < n; i++ {
			msg := make([]byte, 8)
			binary.BigEndian.PutUint32(msg, uint32(r))
			binary.BigEndian.PutUint32(msg[4:], uint32(i))
			require.NoError(t, send.SendNotifyAsync(names[i%2], Notify{Name: "alias", Msg: msg}, func(err error) { results <- err }))
			if i == 0 && r%2 == 1 {
				// Every other round the first name is bound to the peer before the
				// second is first used: the second's handshake then runs while sends
				// under the first go on.
				select {
				case err := <-results:
					require.NoError(t, err, "round %d", r)
					results <- nil
				case <-ctx.Done():
					t.Fatalf("round %d: the first send never ended", r)
				}
			}
		}
		for i := 0; i < n; i++ {
			select {
			case err := <-results:
				require.NoError(t, err, "round %d", r)
			case <-ctx.Done():
				t.Fatalf("round %d: %d of %d sends still without a result", r, n-i, n)
			}
		}
		// Every send was acknowledged: the receiver delivers each (a hang guard only).
		stop := context.AfterFunc(ctx, func() { mu.Lock(); arrived.Broadcast(); mu.Unlock() })
		mu.Lock()
		for len(got[uint32(r)]) < n && ctx.Err() == nil {
			arrived.Wait()
		}
		seq := got[uint32(r)]
		mu.Unlock()
		stop()
		require.Len(t, seq, n, "round %d: every acknowledged notify is delivered once", r)
		maxSeen := -1
		for _, i := range seq {
			if int(i) < maxSeen {
				late++
				if late <= 3 {
					t.Logf("%s round %d: %d delivered after %d", tr, r, i, maxSeen)
				}
			}
			maxSeen = max(maxSeen, int(i))
		}
		total += len(seq)
		st := send.Stats()
		require.Len(t, st.Peers, 1, "round %d: two names, one peer (%+v)", r, st.Peers)
		closed = true
		closeEngine(t, send)
	}
	t.Logf("%s: %d rounds of %d sends alternating %v: %d of %d delivered after a later one", tr, rounds, n, names, late, total)
	return late, total
}

// TestAliasStreamFigures: the figures of a longer run, by hand (rounds of 3000), e.g.
// ALIAS_STREAM=24000 go test -run TestAliasStreamFigures -v ./notify/
func TestAliasStreamFigures(t *testing.T) {
	total, _ := strconv.Atoi(os.Getenv("ALIAS_STREAM"))
	if total < 3000 {
		t.Skip("ALIAS_STREAM (notifies per transport, at least 3000) not set")
	}
	for _, tr := range []string{TransportOOB, TransportRDMATwoSided} {
		late, n := aliasStream(t, tr, total/3000, 3000)
		fmt.Printf("%s: %d of %d delivered after a later one\n", tr, late, n)
	}
}
