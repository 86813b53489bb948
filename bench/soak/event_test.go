package soak

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestEventRoundTrip(t *testing.T) {
	for _, ev := range []Event{
		{K: KindBegin, Slot: "a0e1", Inc: 3},
		{K: KindKill, Slot: "a12e0", Inc: 1},
		{K: KindUp, Eng: "a0e1.3", Slot: "a0e1", Addr: "127.0.0.1:4000"},
		{K: KindStart, Eng: "a0e1.3", Slot: "a1e0", Op: 9, S: 17, P: 12},
		{K: KindResult, Eng: "a0e1.3", Slot: "a1e0", S: 17, P: 12, Class: ClassMaybe, Err: "notify: timeout"},
		{K: KindDeliver, Eng: "a1e0.1", From: "a0e1.3", S: 17, P: 12},
		{K: KindStart, Eng: "a1e0.1", Slot: "a0e1", S: 3, P: 3, From: "a0e1.3", Answer: true},
		{K: KindResult, Eng: "a1e0.1", Slot: "a0e1", S: 3, P: 3, Class: ClassOK, Answer: true},
		{K: KindDeliver, Eng: "a0e1.3", From: "a1e0.1", S: 3, P: 3, Answer: true},
		{K: KindEarlyDone, Eng: "a1e0.1", Slot: "a0e1", S: 3, P: 3, Answer: true, Err: "done ran before SendNotifyAsync returned"},
		{K: KindHang, Eng: "a1e0.1", Slot: "a0e1", Answer: true, Err: "answer 3 (SendNotifyAsync from the handler) still runs after 1m31s"},
		{K: KindDeliver, Eng: "a1e0.1", Bad: "name \"x\" is not soak/<from>/<s>/<p>/<size>"},
		{K: KindClosed, Eng: "a1e0.1"},
		{K: KindOpDone, Eng: "a0e1.3", Slot: "a1e0", Op: 9},
		{K: KindHang, Eng: "a0e1.3", Slot: "a1e0", Err: "SendNotify still runs"},
		{K: KindCrash, Eng: "a0e1.3", Err: "exit status 2"},
		{K: KindLog, Err: "hello"},
		{K: KindBye},
		{K: CmdOp, Eng: "a0e1.3", Slot: "a1e0", Op: 9, Window: 2, Names: []string{"127.0.0.1:1", "localhost:1"},
			Sends: []Send{{P: 1, Size: 10, Name: 1, ID: true, Retries: 2, DeadlineMS: 500}, {P: 2}}},
		{K: CmdReopen, Slot: "a1e0", Inc: 2},
		{K: CmdPause, Slot: "a1e0", MS: 300},
		{K: CmdSlow, Slot: "a1e0", US: 300},
		{K: CmdStop},
		{K: CmdCut},
		{K: CmdSample, Op: sampleFinal},
		{K: KindRes, Res: &Res{RSSKiB: 81920, FDs: 40, Goroutines: 31, Peers: 5, Channels: 2}},
		{K: KindLeak, Eng: "a0e0.1", Err: "goroutines 30 → 900"},
		{K: KindSlowRecovery, Eng: "a0e0.2", Slot: "a1e0", Err: "no notify"},
		{K: CmdWatchStall, Slot: "a1e0", Addr: "127.0.0.1:4000", MS: 3000},
		{K: KindStalled, Eng: "a0e0.2", Slot: "a1e0", Err: "credit 1, 0 in flight, 9 waiting"},
	} {
		line := Encode(ev)
		require.True(t, strings.HasSuffix(string(line), "\n"))
		got, err := Decode(line)
		require.NoError(t, err, "%s", line)
		require.Equal(t, ev, got)
	}
}

func TestDecodeRejects(t *testing.T) {
	for name, line := range map[string]string{
		"not json":           `{"k":`,
		"two objects":        `{"k":"bye"}{"k":"bye"}`,
		"unknown kind":       `{"k":"explode"}`,
		"unknown field":      `{"k":"bye","x":1}`,
		"slot":               `{"k":"begin","slot":"b0e1"}`,
		"slot leading zero":  `{"k":"begin","slot":"a01e1"}`,
		"engine without inc": `{"k":"closed","e":"a0e1"}`,
		"up of another slot": `{"k":"up","e":"a0e1.1","slot":"a0e2"}`,
		"start without s":    `{"k":"start","e":"a0e1.1","slot":"a1e0","p":1}`,
		"result class":       `{"k":"result","e":"a0e1.1","slot":"a1e0","s":1,"p":1,"c":"perhaps"}`,
		"deliver no sender":  `{"k":"deliver","e":"a0e1.1","s":1,"p":1}`,
		"negative inc":       `{"k":"begin","slot":"a0e1","inc":-1}`,
		"op without sends":   `{"k":"op","e":"a0e1.1","slot":"a1e0","names":["x"],"w":1}`,
		"op name index":      `{"k":"op","e":"a0e1.1","slot":"a1e0","names":["x"],"w":1,"sends":[{"p":1,"name":1}]}`,
		"op zero payload":    `{"k":"op","e":"a0e1.1","slot":"a1e0","names":["x"],"w":1,"sends":[{"p":0}]}`,
		"op huge size":       `{"k":"op","e":"a0e1.1","slot":"a1e0","names":["x"],"w":1,"sends":[{"p":1,"n":999999999999}]}`,
		"long line":          `{"k":"log","err":"` + strings.Repeat("x", MaxLine) + `"}`,
		"res missing":        `{"k":"res"}`,
		"res negative":       `{"k":"res","res":{"rss_kib":1,"fds":-1,"goroutines":1,"peers":0,"channels":0}}`,
		"res unknown field":  `{"k":"res","res":{"rss_kib":1,"x":1}}`,
		"leak without e":     `{"k":"leak","err":"x"}`,
		"stalled no slot":    `{"k":"stalled","e":"a0e1.1"}`,
		"watch without addr": `{"k":"watchstall","slot":"a1e0","ms":10}`,
		"answer no from":     `{"k":"start","e":"a0e1.1","slot":"a1e0","s":1,"p":1,"ans":true}`,
		"answer on an op":    `{"k":"op","e":"a0e1.1","slot":"a1e0","names":["x"],"w":1,"sends":[{"p":1}],"ans":true}`,
		"early done no s":    `{"k":"early_done","e":"a0e1.1","slot":"a1e0","p":1,"ans":true}`,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Decode([]byte(line))
			require.ErrorIs(t, err, ErrDecode)
		})
	}
}

func TestNotifyNameAndPayload(t *testing.T) {
	for name, answer := range map[string]bool{NotifyName("a3e1.7", 12, 9, 5): false, AnswerName("a3e1.7", 12, 9, 5): true} {
		from, s, p, size, ans, err := ParseNotifyName(name)
		require.NoError(t, err)
		require.Equal(t, "a3e1.7", from)
		require.EqualValues(t, 12, s)
		require.EqualValues(t, 9, p)
		require.Equal(t, 5, size)
		require.Equal(t, answer, ans, name)
	}
	require.Equal(t, "soak-answer/a3e1.7/12/9/5", AnswerName("a3e1.7", 12, 9, 5))
	for _, bad := range []string{"", "soak/a3e1.7/12/9", "soak/a3e1/12/9/5", "soak/a3e1.7/0/9/5", "x/a3e1.7/1/9/5", "soak/a3e1.7/1/9/-5", "soak/a3e1.7/012/9/5",
		"soak-answer/a3e1.7/12/9", "soak-answers/a3e1.7/1/9/5", "soak-answer/a3e1.7/012/9/5"} {
		_, _, _, _, _, err := ParseNotifyName(bad)
		require.Error(t, err, bad)
	}
	msg := make([]byte, 300)
	FillPayload(msg, 9)
	require.Empty(t, CheckPayload(msg, 9, 300))
	require.NotEmpty(t, CheckPayload(msg, 10, 300), "another payload's pattern")
	require.NotEmpty(t, CheckPayload(msg[:299], 9, 300))
	msg[150] ^= 1
	require.Equal(t, "byte 150 differs", CheckPayload(msg, 9, 300))
	require.Empty(t, CheckPayload(nil, 9, 0))
}

// FuzzDecode: no line makes Decode panic, and what it accepts encodes to a line it decodes
// to the same event.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"k":"deliver","e":"a1e0.1","from":"a0e1.3","s":17,"p":12}`,
		`{"k":"start","e":"a1e0.1","slot":"a0e1","s":3,"p":3,"from":"a0e1.3","ans":true}`,
		`{"k":"op","e":"a0e1.3","slot":"a1e0","op":9,"w":2,"names":["127.0.0.1:1","localhost:1"],"sends":[{"p":1,"n":10,"name":1,"id":true,"r":2,"dl":500}]}`,
		`{"k":"result","e":"a0e1.3","slot":"a1e0","s":17,"p":12,"c":"maybe","err":"x"}`,
		`{"k":"up","e":"a0e1.3","slot":"a0e1","addr":"127.0.0.1:4000"}`,
		`{"k":"bye"}`,
		`{"k":"begin","slot":"a0e1","inc":3}`,
		`{"k":"res","res":{"rss_kib":81920,"fds":40,"goroutines":31,"peers":5,"channels":2}}`,
		`{"k":"watchstall","slot":"a1e0","addr":"127.0.0.1:4000","ms":3000}`,
		`{"k":"stalled","e":"a0e0.2","slot":"a1e0","err":"credit 1"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		ev, err := Decode(line)
		if err != nil {
			require.ErrorIs(t, err, ErrDecode)
			return
		}
		again, err := Decode(Encode(ev))
		require.NoError(t, err)
		require.Equal(t, ev, again)
	})
}

// FuzzParseNotifyName: a name a peer sends never panics the receiving agent, and what it
// accepts is what NotifyName writes.
func FuzzParseNotifyName(f *testing.F) {
	f.Add("soak/a3e1.7/12/9/5")
	f.Add("soak/a0e0.1/1/1/0")
	f.Add("soak-answer/a0e0.1/1/1/0")
	f.Fuzz(func(t *testing.T, name string) {
		from, s, p, size, answer, err := ParseNotifyName(name)
		if err != nil {
			return
		}
		if answer {
			require.Equal(t, AnswerName(from, s, p, size), name)
		} else {
			require.Equal(t, NotifyName(from, s, p, size), name)
		}
	})
}
