package notify

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Errors returned by the engine; test with errors.Is. Every error a caller sees wraps one
// of them, with the peer and the path in the message.
//
// What an error says about delivery: an error that also wraps ErrMaybeDelivered leaves
// the outcome unknown (the notify may have been delivered, at most once); every other
// error means the notify was not delivered and will not be. To retry an unknown outcome
// safely, send the retry with the same Notify.ID: the receiver drops an id it delivered
// within its window.
var (
	ErrClosed          = errors.New("notify: engine closed")
	ErrInvalid         = errors.New("notify: invalid argument")
	ErrTooLarge        = errors.New("notify: notify too large")
	ErrPeerUnreachable = errors.New("notify: peer unreachable")
	ErrNoCtrlChannel   = errors.New("notify: peer has no ctrl channel")
	ErrLimit           = errors.New("notify: limit reached")
	// ErrTimeout: the call's bound ended before it was done: its context's deadline (or
	// the engine's default, 30 s), or the context was cancelled. A cancelled send still
	// wraps ErrTimeout (one test for "the caller stopped waiting"), and also
	// context.Canceled, and its message begins "notify: canceled" instead of "notify:
	// timeout"; a deadline wraps context.DeadlineExceeded where the caller's context ran
	// out. Like any error, it wraps ErrMaybeDelivered when the notify was already on its way.
	ErrTimeout      = errors.New("notify: timeout")
	ErrBackpressure = errors.New("notify: backpressure")
	ErrRejected     = errors.New("notify: rejected by peer")
	ErrAuth         = errors.New("notify: authentication failed")
	// ErrPeerDead: the peer stopped answering: its channel returned no credit for the
	// keepalive's bound, or a channel it handshook was never used.
	ErrPeerDead = errors.New("notify: peer dead")
	// ErrMaybeDelivered marks an error whose notify may have been delivered (a deadline
	// that passed while the notify was on the wire, a connection that broke before the
	// reply). It is never returned alone.
	ErrMaybeDelivered = errors.New("notify: outcome unknown, the notify may have been delivered")
)

// errPeerDevice: the peer's device cannot make the ctrl channel its handshake asked for (a
// port down, a device fatal, a verbs call that failed there). It is ErrNoCtrlChannel, never
// ErrLimit; FailureReason counts it as "peer_device".
var errPeerDevice = fmt.Errorf("%w: the peer's device cannot make one", ErrNoCtrlChannel)

// sendError is an error of one send: a sentinel, the peer, the path, the cause, and
// whether the notify may have been delivered. landed is the earlier attempt that may have
// landed when it is not the one that failed last (attemptLog).
type sendError struct {
	kind   error
	peer   string
	path   string
	cause  error
	maybe  bool
	landed attempt
	last   int // the last attempt's number, with landed
}

func (e *sendError) Error() string {
	s := fmt.Sprintf("%s: send to %s", e.head(), e.peer)
	if e.path != "" && e.landed.n == 0 {
		s += " (" + e.path + ")"
	}
	if e.landed.n != 0 {
		s += fmt.Sprintf(": attempt %d over %s may have landed (%s); attempt %d", e.landed.n, e.landed.path,
			withoutPeer(e.landed.err.Error(), e.peer), e.last)
		if e.path != "" {
			s += " over " + e.path
		}
		s += " failed"
	}
	if e.cause != nil && e.cause != e.kind {
		s += ": " + withoutPeer(e.cause.Error(), e.peer)
	}
	if e.maybe {
		s += " [outcome unknown: the notify may have been delivered]"
	}
	return s
}

// head is the sentinel's text, except that a send whose context was cancelled says so
// (it still wraps ErrTimeout).
func (e *sendError) head() string {
	if e.kind == ErrTimeout && e.cause != nil && errors.Is(e.cause, context.Canceled) {
		return "notify: canceled"
	}
	return e.kind.Error()
}

func (e *sendError) Unwrap() []error {
	errs := []error{e.kind}
	if e.maybe {
		errs = append(errs, ErrMaybeDelivered)
	}
	if e.cause != nil && e.cause != e.kind {
		errs = append(errs, e.cause)
	}
	return errs
}

// attempt is one failed attempt of a send: its number (from 1), its path and its error.
type attempt struct {
	n    int
	path string
	err  error
}

// attemptLog keeps what a send's final error must say of its earlier attempts: how many
// failed, and the first that may have landed. A send whose outcome is unknown because an
// earlier attempt may have landed (a completion error on its channel) while the last one
// failed cleanly (the OOB fallback's connect was refused) names both, so its message does
// not read as a contradiction. Its zero value is empty; it allocates nothing.
type attemptLog struct {
	failed int
	landed attempt
}

// record notes a failed attempt over path; maybe: it may have reached the peer.
func (l *attemptLog) record(path string, err error, maybe bool) {
	l.failed++
	if maybe && l.landed.n == 0 {
		l.landed = attempt{n: l.failed, path: path, err: err}
	}
}

// sendErr is sendErr for the send's final error, after record of its last attempt: when an
// earlier attempt may have landed, the error names it and why the last one failed.
func (l *attemptLog) sendErr(kind error, peer, path string, cause error, maybe bool) error {
	err := sendErr(kind, peer, path, cause, maybe || l.landed.n != 0)
	se, ok := err.(*sendError)
	if !ok || l.landed.n == 0 || l.landed.n == l.failed {
		return err
	}
	se.landed, se.last = l.landed, l.failed
	return se
}

// canceledError is a call other than a send whose context was cancelled: it wraps
// ErrTimeout (the caller stopped waiting) and the context's error, and says "canceled".
type canceledError struct {
	op  string
	err error
}

func (e *canceledError) Error() string   { return "notify: canceled: " + e.op + ": " + e.err.Error() }
func (e *canceledError) Unwrap() []error { return []error{ErrTimeout, e.err} }

// closeError is Close's error: the steps that did not finish, and whether its context
// ended first (then it wraps ErrTimeout and the context's error).
type closeError struct {
	ctx  error // the context's error; nil: it did not end
	errs []error
}

func (e *closeError) Error() string {
	var b strings.Builder
	switch {
	case errors.Is(e.ctx, context.Canceled):
		b.WriteString("notify: canceled: close cut short, the engine stops in the background")
	case e.ctx != nil:
		b.WriteString("notify: timeout: close cut short, the engine stops in the background")
	default:
		b.WriteString("notify: close")
	}
	for i, err := range e.errs {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		b.WriteString(err.Error())
	}
	return b.String()
}

func (e *closeError) Unwrap() []error {
	if e.ctx != nil {
		return append([]error{ErrTimeout, e.ctx}, e.errs...)
	}
	return e.errs
}

// closeErr is Close's result from the errors of its steps (nil ones dropped).
func closeErr(ctx context.Context, errs []error) error {
	var kept []error
	for _, err := range errs {
		if err != nil && (ctx.Err() == nil || !errors.Is(err, ctx.Err()) || len(kept) == 0) {
			kept = append(kept, err)
		}
	}
	if len(kept) == 0 {
		return nil
	}
	return &closeError{ctx: ctx.Err(), errs: kept}
}

// checkPeerAddr checks that peer, as resolved (a directory turns a server name into its
// address), is host:port with a port in 1..65535: a string without a port would otherwise
// fail later as an unreachable peer. It allocates only on failure.
func checkPeerAddr(peer string) error {
	host, port, err := net.SplitHostPort(peer)
	switch {
	case err != nil:
		var ae *net.AddrError
		if errors.As(err, &ae) {
			err = errors.New(ae.Err)
		}
		return fmt.Errorf("peer: %q is not host:port (%v); a server name needs a directory (WithMetadata)", peer, err)
	case host == "":
		return fmt.Errorf("peer: %q has no host", peer)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return fmt.Errorf("peer: %q: port %q is not a number in 1..65535", peer, port)
	}
	return nil
}

// withoutPeer drops "peer: " from a cause's text (lower layers name the address they
// failed on that way), so the message names the peer once.
func withoutPeer(cause, peer string) string {
	if peer == "" {
		return cause
	}
	return strings.ReplaceAll(cause, peer+": ", "")
}

// sendErr wraps cause as a send error of kind. A cause that is already a send error keeps
// its own kind and gains the path when it had none.
func sendErr(kind error, peer, path string, cause error, maybe bool) error {
	var se *sendError
	if errors.As(cause, &se) {
		c := *se
		if c.path == "" {
			c.path = path
		}
		c.maybe = c.maybe || maybe
		return &c
	}
	return &sendError{kind: kind, peer: peer, path: path, cause: cause, maybe: maybe}
}
