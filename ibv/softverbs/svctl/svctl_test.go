//go:build rdma

package svctl_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv/softverbs/svctl"
	"github.com/twosided/twosided/ibv/verbs"
)

// The control file keeps the lines it held, adds one per fault set, and goes back on Reset.
func TestControl(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ctl")
	require.NoError(t, os.WriteFile(path, []byte("drop_pct=5"), 0o600))
	c, err := svctl.NewControl(path)
	require.NoError(t, err)
	read := func() string {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		return string(b)
	}
	require.NoError(t, c.Set("softverbs1", "port", "down"))
	require.NoError(t, c.Set("softverbs0", "fatal", "1"))
	require.NoError(t, c.Set("softverbs1", "port", "up"))
	require.Equal(t, "drop_pct=5\nsoftverbs1.port=up\nsoftverbs0.fatal=1\n", read())
	require.NoError(t, c.Unset("softverbs1", "port"))
	require.NoError(t, c.Unset("softverbs1", "port"))
	require.Equal(t, "drop_pct=5\nsoftverbs0.fatal=1\n", read())
	require.NoError(t, c.Reset())
	require.Equal(t, "drop_pct=5\n", read())
	entries, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary file left")
}

// Over softverbs, a device's board_id and counters read through ibv_read_sysfs_file.
func TestReadSysfsFile(t *testing.T) {
	devs, err := verbs.Provider{}.GetDeviceList()
	if err != nil || len(devs) == 0 {
		t.Skipf("needs libibverbs with a device: %v", err)
	}
	lib, err := verbs.Provider{}.Library()
	require.NoError(t, err)
	dev := devs[0].Name
	if !svctl.IsSoftverbs(lib, dev) {
		t.Skipf("%s is not a softverbs device", dev)
	}
	n, err := svctl.Counter(lib, dev, svctl.LocalAckTimeout)
	require.NoError(t, err)
	require.Zero(t, n, "no QP has run here")
	_, err = svctl.Counter(lib, dev, "no_such_counter")
	require.ErrorContains(t, err, "no such file")
	_, err = svctl.ReadSysfsFile("/nonexistent/libibverbs.so.1", svctl.IBDevPath(dev), "board_id")
	require.ErrorContains(t, err, "not loaded")
}
