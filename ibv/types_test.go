package ibv

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestGIDString(t *testing.T) {
	for _, c := range []struct {
		g    GID
		want string
	}{
		{GID{}, "00:00:00:00:00:00:00:00:00:00:00:00:00:00:00:00"},
		{GID{0xfe, 0x80, 14: 0x01, 15: 0xab}, "fe:80:00:00:00:00:00:00:00:00:00:00:00:00:01:ab"},
		{GID{0x30, 0x39, 10: 0xff, 11: 0xff, 12: 127, 15: 1}, "30:39:00:00:00:00:00:00:00:00:ff:ff:7f:00:00:01"},
		{GID{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, "00:01:02:03:04:05:06:07:08:09:0a:0b:0c:0d:0e:0f"},
	} {
		require.Equal(t, c.want, c.g.String())
		back, err := ParseGID(c.want)
		require.NoError(t, err)
		require.Equal(t, c.g, back)
	}
}

func TestParseGID(t *testing.T) {
	want := GID{0xfe, 0x80, 8: 0x02, 9: 0x42, 10: 0xac, 11: 0xff, 12: 0xfe, 13: 0x11, 15: 0x02}
	for _, s := range []string{
		"fe:80:00:00:00:00:00:00:02:42:ac:ff:fe:11:00:02", // Mooncake's gidBytesToString
		"FE:80:00:00:00:00:00:00:02:42:AC:FF:FE:11:00:02",
		"fe80:0000:0000:0000:0242:acff:fe11:0002", // older twosided
		"FE80:0000:0000:0000:0242:ACFF:FE11:0002",
	} {
		g, err := ParseGID(s)
		require.NoError(t, err, s)
		require.Equal(t, want, g, s)
	}
	for _, bad := range []string{
		"",
		"fe80::1",
		"fe:80:00:00:00:00:00:00:02:42:ac:ff:fe:11:00",     // 15 bytes
		"fe:80:00:00:00:00:00:00:02:42:ac:ff:fe:11:00:02:", // trailing colon
		"fe:80:00:00:00:00:00:00:02:42:ac:ff:fe:11:00:0g",  // not hex
		"fe:80:00:00:00:00:00:00:02:42:ac:ff:fe:11:0:002",  // misplaced colon
		"fe-80-00-00-00-00-00-00-02-42-ac-ff-fe-11-00-02",  // wrong separator
		"fe80:0000:0000:0000:0242:acff:fe11:000x",
		"+e80:0000:0000:0000:0242:acff:fe11:0002",
		" fe80:000:0000:0000:0242:acff:fe11:0002",
		"fe80:0000:0000:0000:0242:acff:fe11:0002:",
	} {
		_, err := ParseGID(bad)
		require.Error(t, err, bad)
		require.True(t, errors.Is(err, ErrBadGID), bad)
	}
}

// FuzzParseGID: whatever parses prints back to Mooncake's form, which parses to the same
// GID; what does not parse wraps ErrBadGID.
func FuzzParseGID(f *testing.F) {
	f.Add("fe:80:00:00:00:00:00:00:02:42:ac:ff:fe:11:00:02")
	f.Add("fe80:0000:0000:0000:0242:acff:fe11:0002")
	f.Add("fe80::1")
	f.Fuzz(func(t *testing.T, s string) {
		g, err := ParseGID(s)
		if err != nil {
			require.ErrorIs(t, err, ErrBadGID)
			return
		}
		back, err := ParseGID(g.String())
		require.NoError(t, err)
		require.Equal(t, g, back)
		require.Len(t, g.String(), 47)
	})
}
