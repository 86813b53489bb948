package tests

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/notify"
)

// TestSelfSendAliases: an engine sends to itself under every name it has (localhost:P,
// 127.0.0.1:P, its own Addr), alternating, on both transports: one pair, every notify
// delivered once and in order. Over rdma_twosided the engine serves itself over OOB (one
// QP's two ends would be one peer's two channels), with or without fallback.
func TestSelfSendAliases(t *testing.T) {
	for _, tc := range []struct {
		tr       string
		fallback bool
	}{{notify.TransportOOB, true}, {rdma, true}, {rdma, false}} {
		t.Run(fmt.Sprintf("%s/fallback=%v", tc.tr, tc.fallback), func(t *testing.T) {
			e := newEngine(t, tc.tr, notify.WithOOBFallback(tc.fallback))
			_, port, ok := strings.Cut(e.Addr(), ":")
			require.True(t, ok)
			names := []string{"localhost:" + port, "127.0.0.1:" + port, e.Addr()}
			ctx := ctxFor(t, 60*time.Second)
			const rounds = 10
			for i := 0; i < rounds*len(names); i++ {
				name := names[(i/rounds+i)%len(names)]
				require.NoError(t, e.SendNotify(ctx, name, notify.Notify{Name: "self", Msg: []byte(strconv.Itoa(i))}), "notify %d to %s", i, name)
			}
			got := recvAll(ctx, e, time.Second)
			want := make([]string, rounds*len(names))
			for i := range want {
				want[i] = strconv.Itoa(i)
			}
			require.Equal(t, want, got)
		})
	}
}
