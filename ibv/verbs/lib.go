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

// loadLibrary loads name after checkLibraryFile found its file sound: the file a path or an
// LD_LIBRARY_PATH entry names is checked before dlopen sees it (a truncated copy would kill
// the process with SIGBUS in dlopen); one found through the ld.so cache or the system
// directories is installed by the system's packages and is checked after a first dlopen
// that only finds it, before the provider uses it. With install false it only tries (the
// table is left as it was), which lets tests try missing or broken libraries in a process
// that loaded another one.
func loadLibrary(name string, fromEnv, install bool) (path string, err error) {
	what := fmt.Sprintf("%q", name)
	if fromEnv {
		what += " (" + EnvLibrary + ")"
	}
	file := libraryFile(name, os.Getenv("LD_LIBRARY_PATH"))
	if file == "" {
		if file, err = dlLoad(name, what, fromEnv, false); err != nil {
			return "", err
		}
	}
	if _, err := os.Stat(file); err != nil {
		return dlLoad(name, what, fromEnv, install) // dlopen says why it cannot open it
	}
	if err := checkLibraryFile(file, neededSymbols()); err != nil {
		if file != name {
			what += " (file " + file + ")"
		}
		return "", fmt.Errorf("%w: %s is not a usable libibverbs: %v (%s)", ErrLibrary, what, err, libraryHint(fromEnv))
	}
	return dlLoad(name, what, fromEnv, install)
}

// libraryHint says what to do about a library that does not load.
func libraryHint(fromEnv bool) string {
	if fromEnv {
		return "check " + EnvLibrary + ", or unset it to load " + DefaultLibrary
	}
	return "install rdma-core's libibverbs (libibverbs1, rdma-core), or set " + EnvLibrary + " to its path"
}

// neededSymbols are shim.c's entry points, with the versions tsv_load resolves them at.
func neededSymbols() []libSymbol {
	n := int(C.tsv_nsyms())
	syms := make([]libSymbol, n)
	for i := range syms {
		ci := C.int(i)
		syms[i] = libSymbol{
			Name:     C.GoString(C.tsv_sym_name(ci)),
			Version:  C.GoString(C.tsv_sym_version(ci)),
			Optional: C.tsv_sym_optional(ci) != 0,
		}
	}
	return syms
}

// dlLoad is tsv_load on name: the path of the file it loaded, or why not.
func dlLoad(name, what string, fromEnv, install bool) (path string, err error) {
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
	dlerr := C.GoString(errBuf)
	switch {
	case rc == 0:
		path = C.GoString(where)
		if abs, err := filepath.Abs(path); err == nil {
			path = abs // found through a relative LD_LIBRARY_PATH entry
		}
		return path, nil
	case rc < 0:
		return "", fmt.Errorf("%w: dlopen %s: %s (%s)", ErrLibrary, what, dlerr, libraryHint(fromEnv))
	}
	i := C.int(rc - 1)
	sym := C.GoString(C.tsv_sym_name(i)) + "@" + C.GoString(C.tsv_sym_version(i))
	return "", fmt.Errorf("%w: %s has no %s, which the verbs provider needs: %s (not rdma-core's libibverbs, or one too old)",
		ErrLibrary, what, sym, dlerr)
}
