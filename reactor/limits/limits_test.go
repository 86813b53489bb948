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
				require.Contains(t, err.Error(), l.Range())
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
		require.ErrorIs(t, err, ErrRange)
		require.Contains(t, err.Error(), l.Env)
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
	require.EqualError(t, err, "MC_RDMA_NOTIFY_CONNECT_TIMEOUT_MS: 99ms out of range 100ms..10m0s")
	_, err = ConnectTimeout.ParseEnv("99999999999999999")
	require.ErrorIs(t, err, ErrRange, "no overflow into range")
	_, err = MTU.ParseEnv("256")
	require.NoError(t, err)
	v, err = GIDIndex.ParseEnv("AUTO")
	require.NoError(t, err)
	require.Equal(t, int64(-1), v)
}
