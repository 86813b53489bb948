package verbs

import (
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// testNeed is a few of the entry points shim.c resolves, at rdma-core's versions; the
// rdma-tagged tests check the whole table (neededSymbols).
var testNeed = []libSymbol{
	{Name: "ibv_get_device_list", Version: "IBVERBS_1.1"},
	{Name: "ibv_open_device", Version: "IBVERBS_1.1"},
	{Name: "ibv_create_comp_channel", Version: "IBVERBS_1.0"},
	{Name: "_ibv_query_gid_table", Version: "IBVERBS_1.11", Optional: true},
}

// realLibibverbs are the rdma-core libibverbs files found here: softverbs (make softverbs)
// and the system's (libibverbs1).
func realLibibverbs(t *testing.T) []string {
	t.Helper()
	var found []string
	for _, p := range []string{
		filepath.Join("..", "..", "build", "softverbs", "libibverbs.so.1"),
		"/usr/lib/x86_64-linux-gnu/libibverbs.so.1",
		"/usr/lib/aarch64-linux-gnu/libibverbs.so.1",
		"/usr/lib64/libibverbs.so.1",
		"/usr/lib/libibverbs.so.1",
	} {
		if _, err := os.Stat(p); err == nil {
			found = append(found, p)
		}
	}
	if len(found) == 0 {
		t.Skip("no libibverbs.so.1 here (make softverbs, or install libibverbs1)")
	}
	return found
}

// writeCopy writes b to a file in a fresh directory and returns its path.
func writeCopy(t *testing.T, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "libibverbs.so.1")
	require.NoError(t, os.WriteFile(p, b, 0o644))
	return p
}

func TestCheckLibraryFileReal(t *testing.T) {
	for _, lib := range realLibibverbs(t) {
		require.NoError(t, checkLibraryFile(lib, testNeed), lib)
	}
}

// Copies cut short, as an interrupted copy or download leaves them: dlopen would map their
// load segments past the file's end and die of SIGBUS on the first page it touches.
func TestCheckLibraryFileTruncated(t *testing.T) {
	for _, lib := range realLibibverbs(t) {
		b, err := os.ReadFile(lib)
		require.NoError(t, err)
		for _, n := range []int{4096, len(b) / 2, len(b) - 1, 64, 10, 0} {
			err := checkLibraryFile(writeCopy(t, b[:n]), testNeed)
			require.Error(t, err, "%s cut to %d bytes", lib, n)
			msg := err.Error()
			if n < 4 {
				require.Contains(t, msg, "not an ELF file", "%d bytes", n)
				continue
			}
			require.Contains(t, msg, "a truncated copy?", "%s cut to %d bytes", lib, n)
		}
	}
}

// A truncated copy whose section headers are gone too (e_shoff and e_shnum zeroed): the
// program headers alone must show that the load segments run past the end.
func TestCheckLibraryFileTruncatedLoadSegment(t *testing.T) {
	for _, lib := range realLibibverbs(t) {
		b, err := os.ReadFile(lib)
		require.NoError(t, err)
		f, err := elf.NewFile(strings.NewReader(string(b)))
		require.NoError(t, err)
		require.Equal(t, elf.ELFCLASS64, f.Class)
		require.Equal(t, binary.LittleEndian, f.ByteOrder)
		half := append([]byte(nil), b[:len(b)/2]...)
		binary.LittleEndian.PutUint64(half[0x28:], 0) // e_shoff
		binary.LittleEndian.PutUint16(half[0x3c:], 0) // e_shnum
		binary.LittleEndian.PutUint16(half[0x3e:], 0) // e_shstrndx
		err = checkLibraryFile(writeCopy(t, half), testNeed)
		require.Error(t, err)
		require.Regexp(t, `^program header \d+ \(PT_LOAD\) ends past the file's end \(byte \d+ of \d+\): a truncated copy\?$`, err.Error())
	}
}

func TestCheckLibraryFileNotELF(t *testing.T) {
	err := checkLibraryFile(writeCopy(t, []byte("INPUT(libibverbs.so.1)\n")), testNeed)
	require.EqualError(t, err, "not an ELF file (23 bytes, no ELF magic number)")
	err = checkLibraryFile(t.TempDir(), testNeed)
	require.ErrorContains(t, err, "not a regular file")
	err = checkLibraryFile(filepath.Join(t.TempDir(), "nothing.so"), testNeed)
	require.ErrorIs(t, err, os.ErrNotExist)
}

// buildStub compiles a shared object that exports each name as a function returning 0,
// with the symbol versions of versions (a linker version script) or none.
func buildStub(t *testing.T, names []string, versions map[string][]string) string {
	t.Helper()
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("needs gcc to build a stub library")
	}
	dir := t.TempDir()
	var src strings.Builder
	for _, n := range names {
		fmt.Fprintf(&src, "long %s(void) { return 0; }\n", n)
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "stub.c"), []byte(src.String()), 0o644))
	args := []string{"-shared", "-fPIC", "-Wl,-soname,libibverbs.so.1", "-o", filepath.Join(dir, "libibverbs.so.1"), filepath.Join(dir, "stub.c")}
	if versions != nil {
		var script strings.Builder
		for v, syms := range versions {
			fmt.Fprintf(&script, "%s { global: %s; };\n", v, strings.Join(syms, "; "))
		}
		require.NoError(t, os.WriteFile(filepath.Join(dir, "stub.map"), []byte(script.String()), 0o644))
		args = append(args, "-Wl,--version-script="+filepath.Join(dir, "stub.map"))
	}
	out, err := exec.Command(cc, args...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	return filepath.Join(dir, "libibverbs.so.1")
}

// A library that exports the ibv_ names without rdma-core's symbol versions: dlvsym would
// take its functions for rdma-core's, whatever they do.
func TestCheckLibraryFileUnversionedStub(t *testing.T) {
	names := []string{"ibv_get_device_list", "ibv_open_device", "ibv_create_comp_channel"}
	stub := buildStub(t, names, nil)
	err := checkLibraryFile(stub, testNeed)
	require.EqualError(t, err, `exports ibv_get_device_list without rdma-core's symbol version IBVERBS_1.1 (has [""]): not rdma-core's libibverbs`)

	// The wrong version (the pre-2006 ABI's) is refused as well.
	stub = buildStub(t, names, map[string][]string{"IBVERBS_1.0": names})
	err = checkLibraryFile(stub, testNeed)
	require.EqualError(t, err, `exports ibv_get_device_list without rdma-core's symbol version IBVERBS_1.1 (has ["IBVERBS_1.0"]): not rdma-core's libibverbs`)

	// A required entry point missing altogether is named; the optional one may be missing.
	stub = buildStub(t, names[:1], map[string][]string{"IBVERBS_1.1": names[:1]})
	err = checkLibraryFile(stub, testNeed)
	require.EqualError(t, err, "has no ibv_open_device@IBVERBS_1.1, which the verbs provider needs (not rdma-core's libibverbs, or one too old)")

	// Versioned as rdma-core does it: accepted.
	stub = buildStub(t, names, map[string][]string{"IBVERBS_1.1": names[:2], "IBVERBS_1.0": names[2:]})
	require.NoError(t, checkLibraryFile(stub, testNeed))
}

func TestLibraryFile(t *testing.T) {
	dir := t.TempDir()
	lib := filepath.Join(dir, "libibverbs.so.1")
	require.NoError(t, os.WriteFile(lib, nil, 0o644))
	require.Equal(t, "/x/libibverbs.so.1", libraryFile("/x/libibverbs.so.1", dir))
	require.Equal(t, "x/libibverbs.so.1", libraryFile("x/libibverbs.so.1", ""))
	require.Equal(t, "", libraryFile("libibverbs.so.1", ""))
	require.Equal(t, "", libraryFile("libibverbs.so.1", "/nonexistent:"+filepath.Join(dir, "sub")))
	require.Equal(t, lib, libraryFile("libibverbs.so.1", "/nonexistent:"+dir))
	require.Equal(t, lib, libraryFile("libibverbs.so.1", "/nonexistent;"+dir+":/usr/lib"))
	t.Chdir(dir)
	require.Equal(t, "libibverbs.so.1", libraryFile("libibverbs.so.1", "/nonexistent::/usr/lib"), "an empty entry is the working directory")
}
