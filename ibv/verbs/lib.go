//go:build rdma

package verbs

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"unsafe"
)

// EnvLibrary names the libibverbs the provider loads instead of the default
// "libibverbs.so.1" (found the way dlopen finds it: LD_LIBRARY_PATH, the ld.so cache, the
// system directories). A path with a slash is opened as it is.
const EnvLibrary = "TWOSIDED_LIBIBVERBS"

// DefaultLibrary is the libibverbs the provider loads when EnvLibrary is not set: rdma-core's
// soname.
const DefaultLibrary = "libibverbs.so.1"

// ErrLibrary: libibverbs could not be loaded (no such library, or one without an entry point
// the provider needs). Errors that wrap it wrap ibv.ErrNoDevice too: a process without
// libibverbs has no verbs device, and the engine goes on with the other providers.
var ErrLibrary = errors.New("libibverbs not loaded")

// lib is the one load of libibverbs in this process: tried at the first use of the provider,
// never again, so every later call returns the same answer.
var lib struct {
	once sync.Once
	path string // the file it was loaded from
	err  error
}

// load loads libibverbs once and returns why it could not.
func load() error {
	lib.once.Do(func() {
		name, fromEnv := libraryName()
		lib.path, lib.err = loadLibrary(name, fromEnv, true)
	})
	return lib.err
}

// Library loads libibverbs if that was not tried yet and says where it was loaded from, or
// why it could not be (an error wrapping ErrLibrary that quotes dlerror).
func (Provider) Library() (path string, err error) {
	if err := load(); err != nil {
		return "", err
	}
	return lib.path, nil
}

// libraryName is EnvLibrary when set, else DefaultLibrary.
func libraryName() (name string, fromEnv bool) {
	if v := strings.TrimSpace(os.Getenv(EnvLibrary)); v != "" {
		return v, true
	}
	return DefaultLibrary, false
}

// loadLibrary is tsv_load on name. With install false it only tries (the table is left as
// it was), which lets tests try missing or broken libraries in a process that loaded
// another one.
func loadLibrary(name string, fromEnv, install bool) (path string, err error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	const bufLen = 4096
	buf := (*C.char)(C.malloc(2 * bufLen))
	defer C.free(unsafe.Pointer(buf))
	errBuf, where := buf, (*C.char)(unsafe.Add(unsafe.Pointer(buf), bufLen))
	inst := C.int(0)
	if install {
		inst = 1
	}
	rc := int(C.tsv_load(cname, inst, errBuf, bufLen, where, bufLen))
	what := fmt.Sprintf("%q", name)
	if fromEnv {
		what += " (" + EnvLibrary + ")"
	}
	dlerr := C.GoString(errBuf)
	switch {
	case rc == 0:
		path = C.GoString(where)
		if abs, err := filepath.Abs(path); err == nil {
			path = abs // found through a relative LD_LIBRARY_PATH entry
		}
		return path, nil
	case rc < 0:
		hint := "install rdma-core's libibverbs (libibverbs1, rdma-core), or set " + EnvLibrary + " to its path"
		if fromEnv {
			hint = "check " + EnvLibrary + ", or unset it to load " + DefaultLibrary
		}
		return "", fmt.Errorf("%w: dlopen %s: %s (%s)", ErrLibrary, what, dlerr, hint)
	}
	i := C.int(rc - 1)
	sym := C.GoString(C.tsv_sym_name(i)) + "@" + C.GoString(C.tsv_sym_version(i))
	return "", fmt.Errorf("%w: %s has no %s, which the verbs provider needs: %s (not rdma-core's libibverbs, or one too old)",
		ErrLibrary, what, sym, dlerr)
}
