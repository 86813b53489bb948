//go:build rdma

package verbs

/*
// No -libverbs: libibverbs is dlopened (lib.go). -ldl for C libraries before glibc 2.34,
// where dlopen lives in libdl; later ones have it in libc and the linker drops the entry.
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"github.com/twosided/twosided/ibv"
)

// Provider is the libibverbs provider, registered as "verbs".
type Provider struct{}

func init() { ibv.Register(Provider{}) }

// Name is "verbs".
func (Provider) Name() string { return "verbs" }

var forkInit struct {
	sync.Mutex
	done bool
}

// ForkInit is ibv_fork_init (ibv.ForkIniter): libibverbs marks registered memory
// MADV_DONTFORK so that a fork() child's copy-on-write pages never replace pages a NIC
// writes into. It must run before the process registers any memory (after that it fails
// with EINVAL); once it succeeded, later calls return nil. Kernels from 5.13 on need none
// of this (libibverbs then does nothing). Setting RDMAV_FORK_SAFE in the environment makes
// libibverbs call it by itself. Go's os/exec forks with CLONE_VM|CLONE_VFORK and shares no
// memory with the child, so only a real fork() (C code, a raw syscall) needs it.
//
// When libibverbs cannot be loaded ForkInit returns nil: no memory is ever registered
// through it, so there is nothing to protect, and the engine goes on with other providers
// (GetDeviceList says why verbs has no device).
func (Provider) ForkInit() error {
	forkInit.Lock()
	defer forkInit.Unlock()
	if forkInit.done || load() != nil {
		return nil
	}
	if rc := C.tsv_fork_init(); rc != 0 {
		return fmt.Errorf("verbs: ibv_fork_init: %w (it must run before any memory is registered)", syscall.Errno(rc))
	}
	forkInit.done = true
	return nil
}

var _ ibv.ForkIniter = Provider{}

// GetDeviceList queries every device libibverbs lists. When no device has an active port
// it returns the devices it found together with an error wrapping ibv.ErrNoDevice that says
// why, so that a listing tool can still show them.
func (Provider) GetDeviceList() ([]ibv.DeviceInfo, error) {
	list, devs, err := deviceList()
	if err != nil {
		return nil, err
	}
	defer C.tsv_free_device_list(list)
	var infos []ibv.DeviceInfo
	var why []string
	for _, d := range devs {
		name := C.GoString(C.tsv_get_device_name(d))
		ctx, errno := C.tsv_open_device(d)
		if ctx == nil {
			why = append(why, fmt.Sprintf("%s: ibv_open_device: %v", name, errnoErr(errno)))
			infos = append(infos, ibv.DeviceInfo{Name: name, Provider: "verbs", NodeGUID: uint64(C.tsv_node_guid(d))})
			continue
		}
		info, err := queryDevice(ctx, name, uint64(C.tsv_node_guid(d)))
		C.tsv_close_device(ctx)
		if err != nil {
			why = append(why, err.Error())
		}
		infos = append(infos, info)
		if _, ok := info.ActivePort(); ok {
			continue
		}
		for _, p := range info.Ports {
			why = append(why, fmt.Sprintf("%s port %d: %s", name, p.Num, p.State))
		}
	}
	for _, d := range infos {
		if _, ok := d.ActivePort(); ok {
			return infos, nil
		}
	}
	return infos, fmt.Errorf("%w: no device with an active port (%s)", ibv.ErrNoDevice, strings.Join(why, "; "))
}

// Open is ibv_open_device on the device called name. Its async fd is made non-blocking.
func (Provider) Open(name string) (ibv.Context, error) {
	list, devs, err := deviceList()
	if err != nil {
		return nil, fmt.Errorf("verbs: open %q: %w", name, err)
	}
	defer C.tsv_free_device_list(list)
	for _, d := range devs {
		if C.GoString(C.tsv_get_device_name(d)) != name {
			continue
		}
		ctx, errno := C.tsv_open_device(d)
		if ctx == nil {
			return nil, fmt.Errorf("verbs: ibv_open_device %q: %w", name, errnoErr(errno))
		}
		info, err := queryDevice(ctx, name, uint64(C.tsv_node_guid(d)))
		if err != nil {
			C.tsv_close_device(ctx)
			return nil, err
		}
		if rc := C.tsv_set_nonblock(ctx.async_fd); rc != 0 {
			C.tsv_close_device(ctx)
			return nil, fmt.Errorf("verbs: %s: async fd O_NONBLOCK: %w", name, syscall.Errno(rc))
		}
		return &deviceContext{
			ctx:      ctx,
			info:     info,
			asyncRaw: new(C.struct_ibv_async_event),
			asyncOut: new(C.struct_tsv_async),
		}, nil
	}
	return nil, fmt.Errorf("verbs: device %q: %w", name, ibv.ErrNoDevice)
}

// deviceList is ibv_get_device_list; the caller frees list. It loads libibverbs first: when
// that fails, the error wraps ibv.ErrNoDevice and ErrLibrary and says why.
func deviceList() (list **C.struct_ibv_device, devs []*C.struct_ibv_device, err error) {
	if err := load(); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ibv.ErrNoDevice, err)
	}
	var n C.int
	list, errno := C.tsv_get_device_list(&n)
	if list == nil {
		return nil, nil, listError(errno)
	}
	if n <= 0 {
		C.tsv_free_device_list(list)
		return nil, nil, listError(nil)
	}
	return list, unsafe.Slice(list, int(n)), nil
}

// listError says why ibv_get_device_list gave no device. errno is nil when the list was
// returned empty.
func listError(errno error) error {
	var e syscall.Errno
	switch {
	case errno == nil:
		return fmt.Errorf("%w: ibv_get_device_list: no device found", ibv.ErrNoDevice)
	case errors.As(errno, &e) && e == syscall.ENOSYS:
		return fmt.Errorf("%w: ibv_get_device_list: %v (no kernel RDMA support)", ibv.ErrNoDevice, e)
	case errors.As(errno, &e) && (e == syscall.EPERM || e == syscall.EACCES):
		return fmt.Errorf("%w: ibv_get_device_list: %v (no access to /dev/infiniband)", ibv.ErrNoDevice, e)
	}
	return fmt.Errorf("%w: ibv_get_device_list: %v", ibv.ErrNoDevice, errno)
}

// errnoErr is the errno a failed libibverbs call left, or EIO when it left none.
func errnoErr(errno error) error {
	if errno == nil {
		return syscall.EIO
	}
	return errno
}

// rcErr is the error of a libibverbs call that returned rc: a positive rc is the errno
// itself, -1 means look at errno.
func rcErr(rc C.int, errno error) error {
	if rc > 0 {
		return syscall.Errno(rc)
	}
	return errnoErr(errno)
}

// queryDevice is ibv_query_device plus ibv_query_port and the GID table for every port.
func queryDevice(ctx *C.struct_ibv_context, name string, guid uint64) (ibv.DeviceInfo, error) {
	info := ibv.DeviceInfo{Name: name, Provider: "verbs", NodeGUID: guid}
	var attr C.struct_ibv_device_attr
	if rc := C.tsv_query_device(ctx, &attr); rc != 0 {
		return info, fmt.Errorf("verbs: %s: ibv_query_device: %w", name, syscall.Errno(rc))
	}
	gids := queryGIDTable(ctx)
	for p := 1; p <= int(attr.phys_port_cnt); p++ {
		pa, err := queryPort(ctx, uint8(p), gids)
		if err != nil {
			return info, fmt.Errorf("verbs: %s: %w", name, err)
		}
		info.Ports = append(info.Ports, pa)
	}
	return info, nil
}

// queryGIDTable reads every valid GID entry of the device; nil when the kernel cannot say
// (queryPort then falls back to ibv_query_gid).
func queryGIDTable(ctx *C.struct_ibv_context) []gidEntry {
	var attr C.struct_ibv_device_attr
	if C.tsv_query_device(ctx, &attr) != 0 {
		return nil
	}
	total := 0
	for p := 1; p <= int(attr.phys_port_cnt); p++ {
		var pa C.struct_ibv_port_attr
		if C.tsv_query_port(ctx, C.uint8_t(p), &pa) == 0 {
			total += int(pa.gid_tbl_len)
		}
	}
	if total == 0 {
		return nil
	}
	entries := make([]C.struct_ibv_gid_entry, total)
	n := int(C.tsv_query_gid_table(ctx, &entries[0], C.size_t(total)))
	if n <= 0 {
		return nil
	}
	out := make([]gidEntry, 0, n)
	for _, e := range entries[:n] {
		var g ibv.GID
		copy(g[:], C.GoBytes(unsafe.Pointer(&e.gid), 16))
		out = append(out, gidEntry{Port: uint8(e.port_num), Index: int(e.gid_index), Type: gidType(e.gid_type), GID: g})
	}
	return out
}

// queryPort is ibv_query_port plus the GID twosided would use on that port.
func queryPort(ctx *C.struct_ibv_context, port uint8, gids []gidEntry) (ibv.PortAttr, error) {
	var pa C.struct_ibv_port_attr
	if rc := C.tsv_query_port(ctx, C.uint8_t(port), &pa); rc != 0 {
		return ibv.PortAttr{}, fmt.Errorf("ibv_query_port %d: %w", port, syscall.Errno(rc))
	}
	out := ibv.PortAttr{
		Num:       port,
		State:     ibv.PortState(pa.state),
		MaxMTU:    ibv.MTU(pa.max_mtu),
		ActiveMTU: ibv.MTU(pa.active_mtu),
		LID:       uint16(pa.lid),
		LinkLayer: "InfiniBand",
	}
	ethernet := pa.link_layer == C.IBV_LINK_LAYER_ETHERNET
	if ethernet {
		out.LinkLayer = "Ethernet"
	}
	if gids == nil {
		// No GID table query: the GID at index 0, the one every port has, of unknown type.
		var g C.union_ibv_gid
		if C.tsv_query_gid(ctx, C.uint8_t(port), 0, &g) == 0 {
			copy(out.GID[:], C.GoBytes(unsafe.Pointer(&g), 16))
		}
		return out, nil
	}
	out.GIDs = portTable(gids, port)
	out.GIDIndex, out.GID = pickGID(gids, port, ethernet)
	return out, nil
}
