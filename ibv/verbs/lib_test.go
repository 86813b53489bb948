//go:build rdma

package verbs

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv"
)

// missingLibrary is a libibverbs that is nowhere: the child processes of the tests below run
// with EnvLibrary set to it, as a host without rdma-core would.
const missingLibrary = "/nonexistent/libibverbs.so.1"

// envLibChild tells a child process which case it runs ("missing" or "env"); libibverbs is
// loaded once per process, so each case needs a process of its own.
const envLibChild = "TWOSIDED_TEST_VERBS_LIB_CHILD"

// libChild runs the tests matching run in a child process of this test binary with env
// added, and requires that each of them passed.
func libChild(t *testing.T, run []string, env ...string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^("+strings.Join(run, "|")+")$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), env...)
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", b)
	for _, name := range run {
		require.Contains(t, string(b), "--- PASS: "+name+" ", "%s", b)
	}
}

// The binary needs no libibverbs to start: it does not list libibverbs.so.1 as NEEDED and
// imports no ibv_ symbol; everything goes through dlopen at first use.
func TestNoLinkTimeLibibverbs(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	f, err := elf.Open(exe)
	require.NoError(t, err)
	defer f.Close()
	libs, err := f.ImportedLibraries()
	require.NoError(t, err)
	for _, l := range libs {
		require.NotContains(t, l, "libibverbs", "NEEDED %s", l)
	}
	syms, err := f.ImportedSymbols()
	require.NoError(t, err)
	var ibvSyms []string
	dl := false
	for _, s := range syms {
		if strings.HasPrefix(s.Name, "ibv_") || strings.HasPrefix(s.Name, "_ibv_") {
			ibvSyms = append(ibvSyms, s.Name+"@"+s.Library)
		}
		dl = dl || s.Name == "dlopen"
	}
	require.Empty(t, ibvSyms, "libibverbs symbols bound at link time")
	require.True(t, dl, "dlopen is imported")
}

func TestLoadLibraryMissing(t *testing.T) {
	_, err := loadLibrary(missingLibrary, true, false)
	require.ErrorIs(t, err, ErrLibrary)
	msg := err.Error()
	require.True(t, strings.HasPrefix(msg, `libibverbs not loaded: dlopen "/nonexistent/libibverbs.so.1" (TWOSIDED_LIBIBVERBS): `), msg)
	require.Contains(t, msg, missingLibrary+": cannot open shared object file", "dlerror's text")
	require.True(t, strings.HasSuffix(msg, "(check TWOSIDED_LIBIBVERBS, or unset it to load libibverbs.so.1)"), msg)

	_, err = loadLibrary("libtwosided-no-such-library.so.1", false, false)
	require.ErrorIs(t, err, ErrLibrary)
	require.Contains(t, err.Error(), `dlopen "libtwosided-no-such-library.so.1": `)
	require.Contains(t, err.Error(), "(install rdma-core's libibverbs (libibverbs1, rdma-core), or set TWOSIDED_LIBIBVERBS to its path)")
}

// A library that is not libibverbs: the first entry point it lacks is named, with its
// symbol version, and the library is closed again.
func TestLoadLibraryMissingSymbol(t *testing.T) {
	_, err := loadLibrary("libc.so.6", true, false)
	require.ErrorIs(t, err, ErrLibrary)
	msg := err.Error()
	require.Contains(t, msg, `libibverbs not loaded: "libc.so.6" (TWOSIDED_LIBIBVERBS) has no ibv_get_device_list@IBVERBS_1.1, which the verbs provider needs: `)
	require.Contains(t, msg, "undefined symbol: ibv_get_device_list", "dlerror's text")
}

// Where libibverbs loads (softverbs through LD_LIBRARY_PATH, or the system's), a probe of
// the same file finds every entry point and says the same path.
func TestLibraryLoaded(t *testing.T) {
	path, err := Provider{}.Library()
	if err != nil {
		require.ErrorIs(t, err, ErrLibrary)
		t.Skipf("libibverbs does not load here: %v", err)
	}
	require.True(t, filepath.IsAbs(path), path)
	require.Equal(t, "libibverbs.so.1", filepath.Base(path))
	again, err := loadLibrary(path, false, false)
	require.NoError(t, err)
	require.Equal(t, path, again)
	p2, err := Provider{}.Library()
	require.NoError(t, err)
	require.Equal(t, path, p2, "loaded once")
}

// Without libibverbs the provider lists no device, says why (dlerror's text, naming the
// library), opens nothing, and fork_init has nothing to do. Run in a child process with
// EnvLibrary pointing nowhere.
func TestWithoutLibrary(t *testing.T) {
	if os.Getenv(envLibChild) != "" {
		t.Skip("this is the child")
	}
	libChild(t, []string{"TestWithoutLibraryChild", "TestEngineWithoutLibraryChild"},
		EnvLibrary+"="+missingLibrary, envLibChild+"=missing")
}

func TestWithoutLibraryChild(t *testing.T) {
	if os.Getenv(envLibChild) != "missing" {
		t.Skip("run by TestWithoutLibrary")
	}
	p := Provider{}
	_, libErr := p.Library()
	require.ErrorIs(t, libErr, ErrLibrary)
	require.Contains(t, libErr.Error(), `dlopen "`+missingLibrary+`" (TWOSIDED_LIBIBVERBS): `)

	devs, err := p.GetDeviceList()
	require.Empty(t, devs)
	require.ErrorIs(t, err, ibv.ErrNoDevice)
	require.ErrorIs(t, err, ErrLibrary)
	require.Equal(t, "no RDMA device: "+libErr.Error(), err.Error())

	_, err = p.Open("softverbs0")
	require.ErrorIs(t, err, ibv.ErrNoDevice)
	require.ErrorIs(t, err, ErrLibrary)
	require.Contains(t, err.Error(), `verbs: open "softverbs0": no RDMA device: libibverbs not loaded: `)

	require.NoError(t, p.ForkInit(), "nothing registered through libibverbs: nothing to protect")

	// The same answer every time: the load is tried once.
	_, again := p.Library()
	require.Equal(t, libErr, again)

	// The registry names the provider.
	vp, err := ibv.LookupProvider("verbs")
	require.NoError(t, err)
	_, err = vp.GetDeviceList()
	require.ErrorIs(t, err, ErrLibrary)
}

// EnvLibrary names the library by path: softverbs loads from build/softverbs whatever
// LD_LIBRARY_PATH says.
func TestLibraryFromEnv(t *testing.T) {
	if os.Getenv(envLibChild) != "" {
		t.Skip("this is the child")
	}
	lib, err := filepath.Abs(filepath.Join("..", "..", "build", "softverbs", "libibverbs.so.1"))
	require.NoError(t, err)
	if _, err := os.Stat(lib); err != nil {
		t.Skipf("needs softverbs (make softverbs): %v", err)
	}
	libChild(t, []string{"TestLibraryFromEnvChild"}, EnvLibrary+"="+lib, envLibChild+"=env")
}

func TestLibraryFromEnvChild(t *testing.T) {
	if os.Getenv(envLibChild) != "env" {
		t.Skip("run by TestLibraryFromEnv")
	}
	path, err := Provider{}.Library()
	require.NoError(t, err)
	require.Equal(t, os.Getenv(EnvLibrary), path)
	devs, err := Provider{}.GetDeviceList()
	require.NoError(t, err)
	require.NotEmpty(t, devs)
	require.True(t, strings.HasPrefix(devs[0].Name, "softverbs"), devs[0].Name)
}

// softverbs and the system's rdma-core pass the check before dlopen with the whole table of
// entry points; a truncated copy is refused by loadLibrary before dlopen sees it.
func TestLoadLibraryChecksTheFile(t *testing.T) {
	for _, lib := range realLibibverbs(t) {
		require.NoError(t, checkLibraryFile(lib, neededSymbols()), lib)
		b, err := os.ReadFile(lib)
		require.NoError(t, err)
		cut := writeCopy(t, b[:len(b)/2])
		_, err = loadLibrary(cut, true, false)
		require.ErrorIs(t, err, ErrLibrary)
		require.Contains(t, err.Error(), `libibverbs not loaded: "`+cut+`" (TWOSIDED_LIBIBVERBS) is not a usable libibverbs: `)
		require.Contains(t, err.Error(), "a truncated copy? (check TWOSIDED_LIBIBVERBS, or unset it to load libibverbs.so.1)")

		// Found through LD_LIBRARY_PATH: the file is named too.
		t.Setenv("LD_LIBRARY_PATH", filepath.Dir(cut))
		_, err = loadLibrary(DefaultLibrary, false, false)
		require.ErrorIs(t, err, ErrLibrary)
		require.Contains(t, err.Error(), `"libibverbs.so.1" (file `+cut+`) is not a usable libibverbs: `)
	}
}
