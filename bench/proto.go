package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"time"

	"github.com/twosided/twosided/notify"
)

// The control protocol between the client and the receiving side of a two-process run:
// one JSON object per line, each line at most maxCtrlLine bytes. A child process reads its
// spec from the environment and speaks it on stdin and stdout; a bench server speaks it on
// a TCP connection of its own, after a versioned hello:
//
//	client → server  {"proto":"twosided-bench","version":1,"spec":{...}}   (no spec: info only)
//	server → client  {"proto":"twosided-bench","version":1,"info":{...}}   or ...,"code":C,"err":E
//
// then, as with a child: {"addrs":[...]} once its nodes listen, and the replies to
// {"cmd":"start"} and {"cmd":"stop","expect":N}. Every decoder checks its bounds.

// ProtoName and ProtoVersion identify the control protocol of the bench server. A client
// and a server of different versions refuse each other with ErrVersion.
const (
	ProtoName    = "twosided-bench"
	ProtoVersion = 1
)

const (
	maxCtrlLine     = 64 << 10
	maxReceivers    = 256
	maxParents      = 256
	maxSendCount    = 1 << 40
	maxSendNS       = int64(10 * time.Minute)
	maxProviderName = 64
)

// Errors of a run against a bench server (Config.Server, --client). Each wraps a notify
// sentinel and the message names the flag and the cause.
var (
	// ErrServerUnreachable: nothing accepted the control connection.
	ErrServerUnreachable error = &sentinel{"bench: server not reachable", notify.ErrPeerUnreachable}
	// ErrNotServer: the address answered, but not as a twosided bench server.
	ErrNotServer error = &sentinel{"bench: not a twosided bench server", notify.ErrPeerUnreachable}
	// ErrVersion: client and server speak different protocol versions.
	ErrVersion error = &sentinel{"bench: protocol version mismatch", notify.ErrRejected}
	// ErrServerRefused: the server cannot run what was asked (a provider it lacks, a
	// transport it cannot open, another client's run in progress, a spec out of bounds).
	ErrServerRefused error = &sentinel{"bench: the server cannot run it", notify.ErrRejected}
	// ErrServerRun: the server failed during a run.
	ErrServerRun error = &sentinel{"bench: the server's side of the run failed", notify.ErrRejected}
	// ErrServerLost: the control connection broke or carried something undecodable.
	ErrServerLost error = &sentinel{"bench: control connection lost", notify.ErrPeerUnreachable}
)

// sentinel is an error of this package that is also a notify sentinel (errors.Is), with
// a message of its own.
type sentinel struct {
	msg  string
	base error
}

func (s *sentinel) Error() string { return s.msg }
func (s *sentinel) Unwrap() error { return s.base }

// errProto is wrapped by every decoding error.
var errProto = errors.New("bench: control message")

// Refusal codes of a hello reply.
const (
	codeVersion     = "version"
	codeBusy        = "busy"
	codeUnsupported = "unsupported"
	codeBad         = "bad"
)

type hello struct {
	Proto   string     `json:"proto"`
	Version int        `json:"version"`
	Spec    *childSpec `json:"spec,omitempty"`
	// Anchor asks the server to run the server side of an anchor for one run instead:
	// anchorUCX starts ucx_perftest there, on the port of the reply's AnchorPort.
	Anchor string `json:"anchor,omitempty"`
}

const anchorUCXServer = "ucx_perftest"

type helloReply struct {
	Proto   string      `json:"proto"`
	Version int         `json:"version"`
	Code    string      `json:"code,omitempty"`
	Err     string      `json:"err,omitempty"`
	Info    *ServerInfo `json:"info,omitempty"`
	// AnchorPort: where the anchor's server listens (a hello with Anchor).
	AnchorPort int `json:"anchor_port,omitempty"`
}

// ServerInfo is what a bench server says about itself; a client's report carries it.
type ServerInfo struct {
	Addr       string   `json:"addr"`       // the address the client reached
	GoVersion  string   `json:"go_version"` // of the server's binary
	GOOS       string   `json:"goos"`
	GOARCH     string   `json:"goarch"`
	NumCPU     int      `json:"num_cpu"`
	Provider   string   `json:"provider"`  // the device an rdma_twosided engine takes there
	Providers  []string `json:"providers"` // ibv providers built into the server's binary
	Commit     string   `json:"commit"`
	ClientAddr string   `json:"client_addr"` // the client's address as the server sees it
}

// newCtrlScanner reads control lines of at most maxCtrlLine bytes.
func newCtrlScanner(r io.Reader) *bufio.Scanner {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxCtrlLine)
	return sc
}

// strictUnmarshal decodes one JSON object and nothing after it.
func strictUnmarshal(line []byte, v any) error {
	if len(line) > maxCtrlLine {
		return fmt.Errorf("%w: %d bytes, more than %d", errProto, len(line), maxCtrlLine)
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %w", errProto, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: trailing data after the object", errProto)
	}
	return nil
}

// decodeHello reads a client's hello. A hello of another version decodes (spec aside) so
// that the server can answer with a version refusal.
func decodeHello(line []byte) (hello, error) {
	var h hello
	var head struct {
		Proto   string `json:"proto"`
		Version int    `json:"version"`
	}
	if err := strictUnmarshal(line, &head); err != nil {
		return h, err
	}
	if head.Proto != ProtoName {
		return h, fmt.Errorf("%w: proto %q, want %q", errProto, head.Proto, ProtoName)
	}
	h.Proto, h.Version = head.Proto, head.Version
	if h.Version != ProtoVersion {
		return h, nil
	}
	if err := strictUnmarshal(line, &h); err != nil {
		return h, err
	}
	if h.Spec != nil {
		if err := h.Spec.validate(); err != nil {
			return h, err
		}
	}
	switch {
	case h.Anchor != "" && h.Anchor != anchorUCXServer:
		return h, fmt.Errorf("%w: anchor %q, want %q", errProto, h.Anchor, anchorUCXServer)
	case h.Anchor != "" && h.Spec != nil:
		return h, fmt.Errorf("%w: a hello asks for a spec or an anchor, not both", errProto)
	}
	return h, nil
}

// decodeHelloReply reads a server's answer to a hello; a line that is not one names the
// peer as no bench server (ErrNotServer is the caller's to wrap).
func decodeHelloReply(line []byte) (helloReply, error) {
	var r helloReply
	if err := strictUnmarshal(line, &r); err != nil {
		return r, err
	}
	if r.Proto != ProtoName {
		return r, fmt.Errorf("%w: proto %q, want %q", errProto, r.Proto, ProtoName)
	}
	if len(r.Err) > maxCtrlLine/2 || len(r.Code) > 32 {
		return r, fmt.Errorf("%w: error text out of bounds", errProto)
	}
	if r.AnchorPort < 0 || r.AnchorPort > 65535 {
		return r, fmt.Errorf("%w: anchor_port %d out of range", errProto, r.AnchorPort)
	}
	if r.Info != nil && (len(r.Info.Providers) > 64 || r.Info.NumCPU < 0) {
		return r, fmt.Errorf("%w: info out of bounds", errProto)
	}
	return r, nil
}

// decodeRequest reads a start or stop request.
func decodeRequest(line []byte) (childRequest, error) {
	var r childRequest
	if err := strictUnmarshal(line, &r); err != nil {
		return r, err
	}
	switch r.Cmd {
	case "start", "stop":
	default:
		return r, fmt.Errorf("%w: cmd %q, want start or stop", errProto, r.Cmd)
	}
	if r.Expect < 0 || r.Expect > maxSendCount {
		return r, fmt.Errorf("%w: expect %d out of range 0..%d", errProto, r.Expect, int64(maxSendCount))
	}
	return r, nil
}

// decodeReply reads a reply of the receiving side.
func decodeReply(line []byte) (childReply, error) {
	var r childReply
	if err := strictUnmarshal(line, &r); err != nil {
		return r, err
	}
	if len(r.Addrs) > maxReceivers {
		return r, fmt.Errorf("%w: %d addresses, at most %d", errProto, len(r.Addrs), maxReceivers)
	}
	for _, a := range r.Addrs {
		if _, err := netip.ParseAddrPort(a); err != nil {
			return r, fmt.Errorf("%w: address %q: %w", errProto, a, err)
		}
	}
	if r.Warm < 0 || r.CPUNS < 0 || r.Delivered < 0 || r.Sent < 0 || r.Errors < 0 {
		return r, fmt.Errorf("%w: negative count", errProto)
	}
	return r, nil
}

// validate bounds a spec: a bench server takes it from the network.
func (s *childSpec) validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: spec: %s: %s", errProto, field, fmt.Sprintf(format, args...))
	}
	switch {
	case !slices.Contains(AllTransports, s.Transport):
		return bad("transport", "%q: want one of %v", s.Transport, AllTransports)
	case s.Receivers < 1 || s.Receivers > maxReceivers:
		return bad("receivers", "%d out of range 1..%d", s.Receivers, maxReceivers)
	case s.Size < 0 || s.Size > maxSize:
		return bad("size", "%d out of range 0..%d", s.Size, maxSize)
	case s.Window < 0 || s.Window > 1024:
		return bad("window", "%d out of range 0..1024", s.Window)
	case s.BusyPollNS < 0 || s.BusyPollNS > int64(time.Second):
		return bad("busy_poll_ns", "%d out of range 0..1s", s.BusyPollNS)
	case len(s.Parent) > maxParents:
		return bad("parent", "%d addresses, at most %d", len(s.Parent), maxParents)
	case s.SendCount < 0 || s.SendCount > maxSendCount:
		return bad("send_count", "%d out of range 0..%d", s.SendCount, int64(maxSendCount))
	case s.SendNS < 0 || s.SendNS > maxSendNS:
		return bad("send_ns", "%d out of range 0..%d", s.SendNS, maxSendNS)
	case len(s.Provider) > maxProviderName:
		return bad("provider", "name longer than %d bytes", maxProviderName)
	case (s.Echo || s.SendCount > 0) && len(s.Parent) == 0:
		return bad("parent", "an echo or bidi run needs the client's address")
	}
	for _, p := range s.Parent {
		ap, err := netip.ParseAddrPort(p)
		if err != nil || !ap.Addr().Is4() {
			return bad("parent", "%q: want an IPv4 host:port", p)
		}
	}
	return nil
}
