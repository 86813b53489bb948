package limits

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTableSane(t *testing.T) {
	names, envs := map[string]bool{}, map[string]bool{}
	for _, l := range All() {
		require.NotEmpty(t, l.Name)
		require.False(t, names[l.Name], "duplicate name %s", l.Name)
		names[l.Name] = true
		if l.Env != "" {
			require.False(t, envs[l.Env], "duplicate variable %s", l.Env)
			envs[l.Env] = true
		}
		require.LessOrEqual(t, l.Min, l.Max, l.Name)
		require.True(t, l.Allowed(l.Default), "%s: default %d not allowed", l.Name, l.Default)
		for _, o := range l.OneOf {
			require.True(t, o >= l.Min && o <= l.Max, "%s: %d outside Min..Max", l.Name, o)
		}
		if l.Unit == Duration && l.Env != "" {
			require.Positive(t, l.EnvUnit, "%s: a duration variable needs its unit", l.Name)
		}
	}
}

// envText writes v (in l's unit) as the variable's integer, rounding toward want.
func envText(l *Limit, v int64, up bool) string {
	if l.Unit == Duration {
		u := int64(l.EnvUnit)
		q := v / u
		if up && v%u != 0 {
			q++
		}
		return strconv.FormatInt(q, 10)
	}
	return strconv.FormatInt(v, 10)
}

// The environment accepts exactly what the option accepts: the boundaries, one unit past
// them, and each special value, for every variable of the table.
func TestEnvRangeIsOptionRange(t *testing.T) {
	for _, l := range All() {
		if l.Env == "" {
			continue
		}
		step := int64(1)
		if l.Unit == Duration {
			step = int64(l.EnvUnit)
		}
		lo, _ := strconv.ParseInt(envText(l, l.Min, true), 10, 64)
		hi, _ := strconv.ParseInt(envText(l, l.Max, false), 10, 64)
		for _, tc := range []struct {
			n int64
		}{{lo}, {hi}, {lo - 1}, {hi + 1}} {
			s := strconv.FormatInt(tc.n, 10)
			v, err := l.ParseEnv(s)
			opt := l.Allowed(tc.n * step)
			if opt {
				require.NoError(t, err, "%s=%s", l.Env, s)
				require.Equal(t, tc.n*step, v)
				require.NoError(t, l.Check(l.Name, v))
			} else {
				require.ErrorIs(t, err, ErrRange, "%s=%s accepted, the option refuses %d", l.Env, s, tc.n*step)
				require.Contains(t, err.Error(), l.Env)
				require.Contains(t, err.Error(), l.EnvRange())
				require.NotContains(t, err.Error(), l.Range(), "the option's notation, not the variable's")
				require.Error(t, l.Check(l.Name, tc.n*step))
			}
		}
		for _, sp := range l.Special {
			if sp.Word != "" {
				v, err := l.ParseEnv(sp.Word)
				require.NoError(t, err)
				require.Equal(t, sp.Value, v)
			}
		}
		_, err := l.ParseEnv("x1")
		require.ErrorIs(t, err, ErrSyntax)
		require.NotErrorIs(t, err, ErrRange, "a parse failure is not a range error")
		require.EqualError(t, err, l.Env+`: "x1" is not an integer (want `+l.EnvRange()+`)`)
	}
}

func TestCheckNamesFieldAndRange(t *testing.T) {
	err := MTU.Check("Config.MTU", 300)
	require.True(t, errors.Is(err, ErrRange))
	require.Equal(t, "Config.MTU: 300 B out of range one of 256 B, 512 B, 1024 B, 2048 B, 4096 B (or 0 B = port)", err.Error())
	require.NoError(t, MTU.Check("mtu", 256), "MTU 256 is an IB MTU")
	require.NoError(t, MTU.Check("mtu", 0))
	err = ConnectTimeout.CheckDuration("connect_timeout", 99*time.Millisecond)
	require.EqualError(t, err, "connect_timeout: 99ms out of range 100ms..10m0s")
	v, err := ConnectTimeout.ParseEnv("2500")
	require.NoError(t, err)
	require.Equal(t, int64(2500*time.Millisecond), v)
	_, err = ConnectTimeout.ParseEnv("99")
	require.EqualError(t, err, "MC_RDMA_NOTIFY_CONNECT_TIMEOUT_MS: 99 is out of range (want 100–600000 ms)")
	_, err = ConnectTimeout.ParseEnv("99999999999999999")
	require.ErrorIs(t, err, ErrRange, "no overflow into range")
	_, err = MTU.ParseEnv("256")
	require.NoError(t, err)
	v, err = GIDIndex.ParseEnv("AUTO")
	require.NoError(t, err)
	require.Equal(t, int64(-1), v)
}

// ParseEnv's messages name the variable and what it accepts as a user types it: bare
// integers in the variable's unit and the special words, never the option's notation
// ("0 B = port"); a parse failure does not say "out of range".
func TestParseEnvMessages(t *testing.T) {
	for _, tc := range []struct {
		l     *Limit
		value string
		want  string
		is    error
	}{
		{&GIDIndex, "abc", `MC_GID_INDEX: "abc" is not an integer (want 0–255 or auto)`, ErrSyntax},
		{&GIDIndex, "1.5", `MC_GID_INDEX: "1.5" is not an integer (want 0–255 or auto)`, ErrSyntax},
		{&GIDIndex, "256", `MC_GID_INDEX: 256 is out of range (want 0–255 or auto)`, ErrRange},
		{&GIDIndex, "-2", `MC_GID_INDEX: -2 is out of range (want 0–255 or auto)`, ErrRange},
		{&GIDIndex, "99999999999999999999", `MC_GID_INDEX: 99999999999999999999 is out of range (want 0–255 or auto)`, ErrRange},
		{&MTU, "300", `MC_MTU: 300 is not one of 256, 512, 1024, 2048, 4096, or port`, ErrRange},
		{&MTU, "mtu", `MC_MTU: "mtu" is not an integer (want 256, 512, 1024, 2048, 4096, or port)`, ErrSyntax},
		{&BufferSize, "255", `MC_RDMA_NOTIFY_BUFFER_SIZE: 255 is out of range (want 256–65536 bytes)`, ErrRange},
		{&ConnectTimeout, "600001", `MC_RDMA_NOTIFY_CONNECT_TIMEOUT_MS: 600001 is out of range (want 100–600000 ms)`, ErrRange},
		{&HandshakeConnectTimeout, "0", `MC_HANDSHAKE_CONNECT_TIMEOUT: 0 is out of range (want 1–3599 s)`, ErrRange},
		{&HandshakeConnectTimeout, "99999999999", `MC_HANDSHAKE_CONNECT_TIMEOUT: 99999999999 is out of range (want 1–3599 s)`, ErrRange},
		{&HandshakePort, "70000", `MC_HANDSHAKE_PORT: 70000 is out of range (want 1–65535 or 0)`, ErrRange},
		{&TrafficClass, "x", `MC_IB_TC: "x" is not an integer (want 0–255 or default)`, ErrSyntax},
	} {
		t.Run(tc.l.Env+"="+tc.value, func(t *testing.T) {
			_, err := tc.l.ParseEnv(tc.value)
			require.EqualError(t, err, tc.want)
			require.ErrorIs(t, err, tc.is)
		})
	}
	// Every word and integer the message names is accepted.
	for _, v := range []string{"256", "4096", "port", "PORT", "0"} {
		_, err := MTU.ParseEnv(v)
		require.NoError(t, err, "MC_MTU=%s", v)
	}
}
