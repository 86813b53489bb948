package metrics

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/twosided/twosided/ibv/soft"
	"github.com/twosided/twosided/notify"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newEngine starts an engine on transport (rdma_twosided runs on the soft provider).
func newEngine(t *testing.T, transport string, opts ...notify.Option) *notify.Engine {
	t.Helper()
	opts = append([]notify.Option{notify.WithTransport(transport),
		notify.WithListenAddr("127.0.0.1:0"), notify.WithConnectTimeout(2 * time.Second)}, opts...)
	e, err := notify.New(opts...)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, e.Close(ctx))
	})
	return e
}

// pair starts two engines on transport and returns them with a context for the test.
func pair(t *testing.T, transport string) (a, b *notify.Engine, ctx context.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return newEngine(t, transport), newEngine(t, transport), ctx
}

// scrape gathers c through a registry and returns every sample by its series name:
// name{l1="v1",...} for counters and gauges, name_count and name_sum for histograms.
func scrape(t *testing.T, c prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName() + labelString(m.GetLabel())
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out[name] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[name] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[mf.GetName()+"_count"] = float64(m.GetHistogram().GetSampleCount())
				out[mf.GetName()+"_sum"] = m.GetHistogram().GetSampleSum()
			}
		}
	}
	return out
}

func labelString(ls []*dto.LabelPair) string {
	if len(ls) == 0 {
		return ""
	}
	parts := make([]string, len(ls))
	for i, l := range ls {
		parts[i] = fmt.Sprintf("%s=%q", l.GetName(), l.GetValue())
	}
	sort.Strings(parts)
	return "{" + strings.Join(parts, ",") + "}"
}

// TestScrapeAfterWorkload: 100 notifies a→b over the ctrl channel, a retry with the same
// Notify.ID (dropped by b as a duplicate), one while the soft link is cut (it falls back to
// OOB), one after it is back, and 3 to a port where nothing listens show as exact counts.
func TestScrapeAfterWorkload(t *testing.T) {
	a := newEngine(t, notify.TransportRDMATwoSided, notify.WithDeviceFilters("soft0"))
	b := newEngine(t, notify.TransportRDMATwoSided, notify.WithDeviceFilters("soft1"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 100
	for i := range n {
		require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "kv", Msg: []byte(fmt.Sprint(i))}))
	}
	for range 2 {
		require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "kv", ID: "retried"}))
	}
	// The cut must meet a SEND on the wire, which needs credit: b returns it from its own
	// loop, so on a loaded machine a's channel can be at its reserve now. A send without
	// credit waits, nothing is posted, and the stall probe, not a failed SEND, finds the
	// cut. So wait (bounded) until a may send.
	require.Eventually(t, func() bool { return a.Stats().Channels.CreditAvail > 1 }, 30*time.Second, time.Millisecond,
		"b returns the ctrl channel's credit")
	require.NoError(t, soft.Default().CutLink("soft0", "soft1"))
	require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "cut"}))
	require.NoError(t, soft.Default().RestoreLink("soft0", "soft1"))
	require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "back"}))
	for range n + 3 {
		_, err := b.Recv(ctx)
		require.NoError(t, err)
	}
	for range 3 {
		err := a.SendNotify(ctx, "127.0.0.1:1", notify.Notify{Name: "lost"})
		require.ErrorIs(t, err, notify.ErrPeerUnreachable)
	}

	sa := scrape(t, New(a))
	require.Equal(t, float64(n+4), sa["twosided_notifies_sent_total"])
	for _, r := range notify.FailureReasons() {
		want := 0.0
		if r == "unreachable" {
			want = 3
		}
		require.Equal(t, want, sa[`twosided_notifies_failed_total{reason="`+r+`"}`], r)
	}
	require.Equal(t, 1.0, sa["twosided_notify_fallbacks_total"], "the notify sent while the link was cut")
	require.Equal(t, 1.0, sa["twosided_channels_up"])
	require.Equal(t, 1.0, sa["twosided_peers"], "b; an unreachable name leaves nothing behind")
	require.Equal(t, float64(n+4), sa["twosided_send_to_ack_seconds_count"])
	require.Greater(t, sa["twosided_send_to_ack_seconds_sum"], 0.0)
	require.GreaterOrEqual(t, sa["twosided_ctrl_frames_sent_total"], float64(n+1))
	require.Equal(t, 0.0, sa["twosided_notifies_delivered_total"])
	require.Equal(t, 1.0, sa[`twosided_engine_info{device="soft0",name="`+a.Addr()+`",transport="rdma_twosided"}`])
	require.Greater(t, sa["twosided_reactor_wakeups_total"], 0.0)
	require.Greater(t, sa["twosided_reactor_busy_seconds_total"], 0.0)
	require.Greater(t, sa["twosided_wc_errors_total"], 0.0, "the cut failed a SEND")

	sb := scrape(t, New(b))
	require.Equal(t, float64(n+3), sb["twosided_notifies_delivered_total"])
	require.Equal(t, 1.0, sb["twosided_notify_duplicates_dropped_total"], "the retry with the same id")
	require.Equal(t, float64(n+3), sb["twosided_receive_to_deliver_seconds_count"])
	require.Equal(t, 0.0, sb["twosided_receive_queue_depth"])
	require.Equal(t, 1.0, sb["twosided_channels_up"])
	require.Equal(t, 0.0, sb["twosided_notifies_sent_total"])
	require.Equal(t, 0.0, sb["twosided_send_to_ack_seconds_count"])
	// a's channel was used at once: nothing unconfirmed, nothing evicted.
	for _, s := range []string{"twosided_unconfirmed_channels", `twosided_unconfirmed_channels_closed_total{reason="evicted"}`,
		`twosided_unconfirmed_channels_closed_total{reason="expired"}`, "twosided_peers_evicted_total"} {
		v, ok := sb[s]
		require.True(t, ok, "%s exported", s)
		require.Zero(t, v, s)
	}
	for _, r := range dropReasons {
		require.Equal(t, 0.0, sb[`twosided_frames_dropped_total{reason="`+r+`"}`], r)
	}
	require.Equal(t, len(notify.FailureReasons()), testutil.CollectAndCount(New(b), "twosided_notifies_failed_total"))
}

// TestQueueDepth: notifies not yet consumed show as the receive queue's depth, and the
// time they waited is observed once they are taken.
func TestQueueDepth(t *testing.T) {
	a, b, ctx := pair(t, notify.TransportOOB)
	for range 5 {
		require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "q"}))
	}
	s := scrape(t, New(b))
	require.Equal(t, 5.0, s["twosided_receive_queue_depth"])
	require.Equal(t, 0.0, s["twosided_receive_to_deliver_seconds_count"])
	require.Len(t, b.GetNotifies(), 5)
	s = scrape(t, New(b))
	require.Equal(t, 0.0, s["twosided_receive_queue_depth"])
	require.Equal(t, 5.0, s["twosided_receive_to_deliver_seconds_count"])
	require.Equal(t, 5.0, s["twosided_notifies_delivered_total"])
	require.Equal(t, 0.0, s["twosided_channels_up"], "oob transport")
}

// TestLint: names, units and help texts pass client_golang's promlint.
func TestLint(t *testing.T) {
	a, b, ctx := pair(t, notify.TransportRDMATwoSided)
	require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "x"}))
	problems, err := testutil.CollectAndLint(New(a, WithPeerLabels(4)))
	require.NoError(t, err)
	require.Empty(t, problems)
}

// TestPeerLabelsCapped: with a cap of 1, one peer of two gets series; the other is counted
// as unlabeled; without the option there is no per-peer series at all.
func TestPeerLabelsCapped(t *testing.T) {
	a, b, ctx := pair(t, notify.TransportRDMATwoSided)
	c := newEngine(t, notify.TransportRDMATwoSided)
	require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "x"}))
	require.NoError(t, a.SendNotify(ctx, c.Addr(), notify.Notify{Name: "x"}))
	require.NoError(t, a.SendNotify(ctx, c.Addr(), notify.Notify{Name: "x"}))

	col := New(a, WithPeerLabels(1))
	s := scrape(t, col)
	first, second := b.Addr(), c.Addr()
	if second < first {
		first, second = second, first
	}
	require.Equal(t, 1, testutil.CollectAndCount(col, "twosided_peer_notifies_sent_total"))
	_, ok := s[`twosided_peer_notifies_sent_total{peer="`+first+`"}`]
	require.True(t, ok, "the first peer by name gets the label: %v", s)
	require.Equal(t, 1.0, s[`twosided_peer_channel_up{peer="`+first+`"}`])
	require.Equal(t, 1.0, s["twosided_peers_unlabeled"])
	require.Zero(t, testutil.CollectAndCount(New(a), "twosided_peer_notifies_sent_total"))

	want := map[string]float64{b.Addr(): 1, c.Addr(): 2}
	s = scrape(t, New(a, WithPeerLabels(8)))
	for p, v := range want {
		require.Equal(t, v, s[`twosided_peer_notifies_sent_total{peer="`+p+`"}`], p)
	}
	require.Equal(t, 0.0, s["twosided_peers_unlabeled"])
}

// TestCollectDuringTraffic: scrapes race with pipelined sends (run with -race); every
// counter only grows from one scrape to the next, and the last scrape has every send.
func TestCollectDuringTraffic(t *testing.T) {
	a := newEngine(t, notify.TransportRDMATwoSided)
	b := newEngine(t, notify.TransportRDMATwoSided, notify.WithHandler(func(notify.Notify) {}))
	col := New(a, WithPeerLabels(2))
	colB := New(b)
	const n = 2000
	var wg sync.WaitGroup
	var failed sync.Map
	slots := make(chan struct{}, 32)
	wg.Add(n)
	go func() {
		for i := range n {
			slots <- struct{}{}
			err := a.SendNotifyAsync(b.Addr(), notify.Notify{Name: "t"}, func(err error) {
				if err != nil {
					failed.Store(i, err)
				}
				<-slots
				wg.Done()
			})
			if err != nil {
				failed.Store(i, err)
				<-slots
				wg.Done()
			}
		}
	}()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	prev := map[string]float64{}
	for scraping := true; scraping; {
		select {
		case <-done:
			scraping = false
		default:
		}
		cur := scrape(t, col)
		for k, v := range scrape(t, colB) {
			cur["b:"+k] = v
		}
		for k, v := range cur {
			if strings.HasSuffix(strings.SplitN(k, "{", 2)[0], "_total") || strings.HasSuffix(k, "_count") {
				require.GreaterOrEqual(t, v, prev[k], "%s went back", k)
			}
		}
		prev = cur
	}
	failed.Range(func(k, v any) bool { t.Errorf("send %v: %v", k, v); return true })
	s := scrape(t, col)
	require.Equal(t, float64(n), s["twosided_notifies_sent_total"])
	require.Equal(t, float64(n), s["twosided_send_to_ack_seconds_count"])
	require.Eventually(t, func() bool { return scrape(t, colB)["twosided_notifies_delivered_total"] == n },
		10*time.Second, time.Millisecond)
}

// TestScrapeAfterClose: a closed engine still answers a scrape, with its final counts.
func TestScrapeAfterClose(t *testing.T) {
	a, b, ctx := pair(t, notify.TransportOOB)
	require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "x"}))
	require.NoError(t, a.Close(ctx))
	err := a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "x"})
	require.ErrorIs(t, err, notify.ErrClosed)
	s := scrape(t, New(a))
	require.Equal(t, 1.0, s["twosided_notifies_sent_total"])
	require.Equal(t, 1.0, s[`twosided_notifies_failed_total{reason="closed"}`])
}

// TestTwoEnginesOneRegistry: with an engine label each, two engines' collectors register
// and gather side by side; without one they collide.
func TestTwoEnginesOneRegistry(t *testing.T) {
	a, b, _ := pair(t, notify.TransportOOB)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(New(a, WithConstLabels(prometheus.Labels{"engine": "a"}))))
	require.NoError(t, reg.Register(New(b, WithConstLabels(prometheus.Labels{"engine": "b"}))))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	series := map[string]int{}
	for _, mf := range mfs {
		series[mf.GetName()] = len(mf.GetMetric())
	}
	require.Equal(t, 2, series["twosided_peers"], "one series per engine")
	require.Error(t, reg.Register(New(a)), "a second collector without a label collides")
}
