package notify

import (
	"reflect"
	"slices"
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

// sameFields checks that every field of in (embedded structs walked) has a field of the
// same name and value in out, but for the names in skip.
func sameFields(t *testing.T, in, out any, skip ...string) {
	t.Helper()
	iv, ov := reflect.ValueOf(in), reflect.ValueOf(out)
	for i := 0; i < iv.NumField(); i++ {
		f := iv.Type().Field(i)
		if f.Anonymous {
			sameFields(t, iv.Field(i).Interface(), out, skip...)
			continue
		}
		if slices.Contains(skip, f.Name) {
			continue
		}
		o := ov.FieldByName(f.Name)
		require.True(t, o.IsValid(), "%s.%s is not copied", iv.Type(), f.Name)
		require.Equal(t, iv.Field(i).Interface(), o.Interface(), f.Name)
	}
}

// TestChannelStatsOf: each field comes from the lower layer's field of the same name.
func TestChannelStatsOf(t *testing.T) {
	var in ctrlchannel.ChannelStats
	numbered(&in)
	in.PathMTU = ibv.MTU2048
	got := channelStatsOf(in)
	sameFields(t, in, got, "PathMTU", "LegacyDelivered")
	require.Equal(t, 2048, got.PathMTU)
	require.Equal(t, in.LegacyDelivered, got.RawDelivered, "one name per fact: raw (headerless) notifies")
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

// TestLowerStatsCopied: the reactor's, the OOB node's, the peer machine's and the
// windows' counters reach notify's exported types field by field.
func TestLowerStatsCopied(t *testing.T) {
	var rs reactor.Stats
	numbered(&rs)
	rs.LongestCallback, rs.Busy = 7*time.Millisecond, 9*time.Second
	var os oob.Stats
	numbered(&os)
	var ms machineStats
	numbered(&ms)
	var ws windowStats
	numbered(&ws)
	sameFields(t, rs, reactorStatsOf(rs))
	sameFields(t, os, oobStatsOf(os))
	sameFields(t, ms, limitStatsOf(ms))
	sameFields(t, ws, windowStatsOf(ws))
}
