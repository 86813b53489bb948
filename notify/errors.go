package notify

import (
	"errors"
	"fmt"
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
	ErrTimeout         = errors.New("notify: timeout")
	ErrBackpressure    = errors.New("notify: backpressure")
	ErrRejected        = errors.New("notify: rejected by peer")
	ErrAuth            = errors.New("notify: authentication failed")
	// ErrPeerDead: the peer stopped answering: its channel returned no credit for the
	// keepalive's bound, or a channel it handshook was never used.
	ErrPeerDead = errors.New("notify: peer dead")
	// ErrMaybeDelivered marks an error whose notify may have been delivered (a deadline
	// that passed while the notify was on the wire, a connection that broke before the
	// reply). It is never returned alone.
	ErrMaybeDelivered = errors.New("notify: outcome unknown, the notify may have been delivered")
)

// sendError is an error of one send: a sentinel, the peer, the path, the cause, and
// whether the notify may have been delivered.
type sendError struct {
	kind  error
	peer  string
	path  string
	cause error
	maybe bool
}

func (e *sendError) Error() string {
	s := fmt.Sprintf("%v: send to %s", e.kind, e.peer)
	if e.path != "" {
		s += " (" + e.path + ")"
	}
	if e.cause != nil && e.cause != e.kind {
		s += ": " + withoutPeer(e.cause.Error(), e.peer)
	}
	if e.maybe {
		s += " [outcome unknown: the notify may have been delivered]"
	}
	return s
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
