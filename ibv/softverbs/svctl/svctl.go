//go:build rdma

// Package svctl drives softverbs (ibv/softverbs), the userspace libibverbs, from Go tests in
// the process that loaded it: its fault control file (SOFTVERBS_CTL) and its devices'
// statistics, which softverbs answers through rdma-core's own ibv_read_sysfs_file, under the
// made-up sysfs path of each device as a NIC's hw_counters. It is test support, not API;
// build tag rdma (cgo), like the verbs provider.
package svctl

/*
#include <dlfcn.h>
#include <stdlib.h>

typedef int (*svctl_read_fn)(const char *, const char *, char *, size_t);

// svctl_read calls ibv_read_sysfs_file of the libibverbs already loaded from lib (it loads
// nothing): the byte count, -1 with errno, or -2 when lib is not loaded or lacks the symbol.
static int svctl_read(const char *lib, const char *dir, const char *file, char *buf, size_t size)
{
	void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
	if (!h)
		return -2;
	svctl_read_fn f = (svctl_read_fn)dlsym(h, "ibv_read_sysfs_file");
	int rc = f ? f(dir, file, buf, size) : -2;
	dlclose(h);
	return rc;
}
*/
import "C"

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"unsafe"
)

// BoardID is what softverbs answers for a device's board_id.
const BoardID = "SOFTVERBS_0001"

// Counter names (<ibdev_path>/ports/1/hw_counters/<name>), ibv/softverbs/README.md.
const (
	TxPackets        = "tx_packets"
	RxPackets        = "rx_packets"
	TxDropped        = "tx_dropped"
	RxDropped        = "rx_dropped"
	RNRNakSent       = "rnr_nak_sent"
	RNRNakReceived   = "rnr_nak_received"
	SeqNakSent       = "seq_nak_sent"
	SeqNakReceived   = "seq_nak_received"
	DuplicateRequest = "duplicate_request"
	LocalAckTimeout  = "local_ack_timeout"
	RetryExceeded    = "retry_exceeded"
	RNRRetryExceeded = "rnr_retry_exceeded"
	// Same-host payloads: packets sent as references, payloads read from the sender, and
	// references the receiver could not read (the sender then sends the bytes).
	SameHostTxPackets = "samehost_tx_packets"
	SameHostRxPackets = "samehost_rx_packets"
	SameHostRefused   = "samehost_refused"
)

// IBDevPath is a device's sysfs directory, as libibverbs names it (ibv_device.ibdev_path);
// softverbs answers below the same made-up path.
func IBDevPath(dev string) string { return "/sys/class/infiniband/" + dev }

// ReadSysfsFile is ibv_read_sysfs_file(dir, file) of the libibverbs loaded from lib (the path
// ibv/verbs's Provider.Library reports); it loads nothing itself.
func ReadSysfsFile(lib, dir, file string) (string, error) {
	clib, cdir, cfile := C.CString(lib), C.CString(dir), C.CString(file)
	defer C.free(unsafe.Pointer(clib))
	defer C.free(unsafe.Pointer(cdir))
	defer C.free(unsafe.Pointer(cfile))
	const size = 256
	buf := (*C.char)(C.malloc(size))
	defer C.free(unsafe.Pointer(buf))
	n, errno := C.svctl_read(clib, cdir, cfile, buf, size)
	switch {
	case n == -2:
		return "", fmt.Errorf("svctl: %s is not loaded in this process, or has no ibv_read_sysfs_file", lib)
	case n < 0:
		return "", fmt.Errorf("svctl: ibv_read_sysfs_file %s/%s: %w", dir, file, errno)
	}
	return string(bytes.TrimRight(C.GoBytes(unsafe.Pointer(buf), n), "\x00\n")), nil
}

// IsSoftverbs reports whether dev is a softverbs device of the libibverbs loaded from lib.
func IsSoftverbs(lib, dev string) bool {
	id, err := ReadSysfsFile(lib, IBDevPath(dev), "board_id")
	return err == nil && id == BoardID
}

// Counter reads one statistic of dev.
func Counter(lib, dev, name string) (uint64, error) {
	v, err := ReadSysfsFile(lib, IBDevPath(dev), "ports/1/hw_counters/"+name)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("svctl: %s counter %s: %q: %w", dev, name, v, err)
	}
	return n, nil
}

// Control writes a softverbs control file: the lines it held when NewControl read it, then
// one `<device>.<key>=<value>` line per fault set here. Every write replaces the file at once
// (a rename), so softverbs never reads half of one. softverbs applies a change when a
// context's thread next reads the file (within 100 ms) or at once in ibv_open_device and
// INIT→RTR.
type Control struct {
	path string
	base string
	mu   sync.Mutex
	set  map[string]string // "<device>.<key>" → value
	keys []string          // in the order first set
}

// NewControl takes over path (SOFTVERBS_CTL), keeping what it holds.
func NewControl(path string) (*Control, error) {
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("svctl: %w", err)
	}
	base := string(b)
	if base != "" && !strings.HasSuffix(base, "\n") {
		base += "\n"
	}
	return &Control{path: path, base: base, set: map[string]string{}}, nil
}

// Path is the control file.
func (c *Control) Path() string { return c.path }

// Set sets a fault of dev: key port (up, down), fatal (0, 1), rtr_delay_ms, rtr_fail, drop_pct.
func (c *Control) Set(dev, key, value string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := dev + "." + key
	if _, ok := c.set[k]; !ok {
		c.keys = append(c.keys, k)
	}
	c.set[k] = value
	return c.write()
}

// Unset drops a fault of dev set here: the device goes back to the environment's and the
// file's other lines.
func (c *Control) Unset(dev, key string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := dev + "." + key
	if _, ok := c.set[k]; !ok {
		return nil
	}
	delete(c.set, k)
	for i, x := range c.keys {
		if x == k {
			c.keys = append(c.keys[:i], c.keys[i+1:]...)
			break
		}
	}
	return c.write()
}

// Reset writes the file back as NewControl found it.
func (c *Control) Reset() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.set, c.keys = map[string]string{}, nil
	return c.write()
}

func (c *Control) write() error {
	var b strings.Builder
	b.WriteString(c.base)
	for _, k := range c.keys {
		b.WriteString(k + "=" + c.set[k] + "\n")
	}
	f, err := os.CreateTemp(filepath.Dir(c.path), ".svctl-*")
	if err != nil {
		return fmt.Errorf("svctl: %w", err)
	}
	_, err = f.WriteString(b.String())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), c.path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("svctl: write %s: %w", c.path, err)
	}
	return nil
}
