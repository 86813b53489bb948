package notify

import (
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ctrlchannel"
	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/oob"
	"github.com/twosided/twosided/reactor"
)

// numbered sets every numeric field of the struct *p to a distinct value, from 1.
func numbered(p any) {
	n := 0
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		for i := 0; i < v.NumField(); i++ {
			f := v.Field(i)
			switch f.Kind() {
			case reflect.Struct:
				walk(f)
			case reflect.Uint64, reflect.Uint32:
				n++
				f.SetUint(uint64(n))
			case reflect.Int, reflect.Int64:
				n++
				f.SetInt(int64(n))
			}
		}
	}
	walk(reflect.ValueOf(p).Elem())
}

// TestChannelStatsOf: each field comes from the lower layer's field of the same meaning.
func TestChannelStatsOf(t *testing.T) {
	var in ctrlchannel.ChannelStats
	numbered(&in)
	in.PathMTU = ibv.MTU2048
	got := channelStatsOf(in)
	require.Equal(t, ChannelStats{
		FramesSent: in.FramesSent, FramesReceived: in.FramesReceived, NotifiesSent: in.NotifiesSent,
		Delivered: in.Delivered, GrantsSent: in.GrantsSent,
		DupFramesDropped: in.DupsDropped, StaleFramesDropped: in.StaleDropped,
		ForeignFramesDropped: in.ForeignDropped, IgnoredFrames: in.Ignored,
		CreditWaits: in.CreditWaits, CreditOverruns: in.CreditOverruns,
		Backpressured: in.Backpressured, Expired: in.Expired, TooLarge: in.TooLarge, SendsFailed: in.Failed,
		KeepalivesSent: in.KeepalivesSent, KeepalivesReceived: in.KeepalivesReceived,
		WCErrors: in.WCErrors, RNRRetryExceeded: in.RNRRetryExceeded, PostErrors: in.PostErrors,
		CreditAvail: in.CreditAvail, Pending: in.Pending, InFlight: in.InFlight, Held: in.Held,
		SendSlots: in.SendSlots, PathMTU: 2048,
	}, got)
}

// TestChannelStatsAdd: every counter sums; gauges only for live channels, so a closed
// channel leaves its counters and none of its gauges in the engine's totals.
func TestChannelStatsAdd(t *testing.T) {
	var one ChannelStats
	numbered(&one)
	var sum ChannelStats
	sum.add(one, false)
	sum.add(one, true)
	v, o := reflect.ValueOf(sum), reflect.ValueOf(one)
	for i := 0; i < v.NumField(); i++ {
		name := v.Type().Field(i).Name
		switch f := v.Field(i); f.Kind() {
		case reflect.Uint64:
			want := 2 * o.Field(i).Uint()
			if name == "CreditAvail" {
				want = o.Field(i).Uint()
			}
			require.Equal(t, want, f.Uint(), name)
		case reflect.Int:
			require.Equal(t, o.Field(i).Int(), f.Int(), "%s: a gauge, once", name)
		}
	}
}

// TestLowerStatsCopied: the reactor's and the OOB node's counters reach notify's types
// field by field (every field of the lower struct has a same-named one here).
func TestLowerStatsCopied(t *testing.T) {
	var rs reactor.Stats
	numbered(&rs)
	rs.LongestCallback, rs.Busy = 7*time.Millisecond, 9*time.Second
	var os oob.Stats
	numbered(&os)
	for _, c := range []struct{ in, out any }{{rs, reactorStatsOf(rs)}, {os, oobStatsOf(os)}} {
		in, out := reflect.ValueOf(c.in), reflect.ValueOf(c.out)
		for i := 0; i < in.NumField(); i++ {
			name := in.Type().Field(i).Name
			f := out.FieldByName(name)
			require.True(t, f.IsValid(), "%s.%s is not copied", in.Type(), name)
			require.Equal(t, in.Field(i).Interface(), f.Interface(), name)
		}
	}
}
