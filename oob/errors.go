package oob

import (
	"errors"
	"strings"
)

var (
	// ErrClosed: the Node was closed; pending requests fail with it.
	ErrClosed = errors.New("oob: closed")
	// ErrRejected: the peer answered, and said no (empty notify_msg, non-empty reply_msg).
	ErrRejected = errors.New("oob: rejected by peer")
	// ErrTimeout: a connect, a request or an idle connection ran past its deadline.
	ErrTimeout = errors.New("oob: timeout")
	// ErrPeerUnreachable: the peer could not be connected, or the connection broke before
	// the reply came.
	ErrPeerUnreachable = errors.New("oob: peer unreachable")
	// ErrFrameTooLarge: a frame length above the configured maximum.
	ErrFrameTooLarge = errors.New("oob: frame too large")
	// ErrBadFrame: a frame that is malformed (zero length, unknown type, bad JSON, a field
	// of the wrong type or out of range).
	ErrBadFrame = errors.New("oob: bad frame")
	// ErrBadConfig: a Config field out of range; the message names the field.
	ErrBadConfig = errors.New("oob: bad config")
	// ErrAuth: authentication failed: the peer could not prove the AuthKey, refused our
	// proof, requires a key this Node does not have, or cannot authenticate at all (a
	// Mooncake peer) while AllowUnauthenticated is false.
	ErrAuth = errors.New("oob: authentication failed")
	// ErrBadRequest: a request argument the caller got wrong; the message names the field.
	ErrBadRequest = errors.New("oob: bad request")
	// ErrNotSent marks a failure before any byte of the request was written: the peer's
	// name did not resolve, or the connection was never made (refused, timed out,
	// unroutable). The request was certainly not delivered.
	ErrNotSent = errors.New("oob: nothing sent")
)

// Sentinels of typed refusals (ts_refuse) and of limits. A refusal from a twosided peer
// wraps ErrRejected and the sentinel of its code; read the code with errors.As on a
// *RefusedError.
var (
	// ErrBusy: the peer's receive queue is full; try again later (code "busy").
	ErrBusy = errors.New("oob: peer busy")
	// ErrLimit: a limit was reached, ours or the peer's (code "limit"; MaxConns,
	// MaxPendingHandshakes, a per-address cap).
	ErrLimit = errors.New("oob: limit reached")
	// ErrNoCtrl: the peer serves no control channel (code "no_ctrl"); use OOB notifies.
	ErrNoCtrl = errors.New("oob: peer has no control channel")
	// ErrPeerClosed: the peer is closing (code "closed").
	ErrPeerClosed = errors.New("oob: peer closing")
	// ErrInvalid: the peer found the request invalid (code "invalid").
	ErrInvalid = errors.New("oob: invalid request")
	// ErrStale: the peer no longer takes this seq; it was given up (code "stale").
	ErrStale = errors.New("oob: stale sequence")
	// ErrNotifyTooLarge: the peer refused a notify above its size limit (code "too_large").
	ErrNotifyTooLarge = errors.New("oob: notify above the peer's limit")
	// ErrTooLarge: a request whose encoded frame would exceed the peer's frame limit;
	// refused before it is sent. The message names both sizes.
	ErrTooLarge = errors.New("oob: request too large")
)

// Refusal codes (ts_refuse). A refusal reply carries one of them; an error reply still
// carries its text in reply_msg (and notify_msg "") for Mooncake readers.
const (
	RefuseNoCtrl  = "no_ctrl" // no control channel here: ErrNoCtrl
	RefuseLimit   = "limit"   // a limit was reached: ErrLimit
	RefuseAuth    = "auth"    // a token or key did not match: ErrAuth
	RefuseClosed  = "closed"  // the receiver is closing: ErrPeerClosed
	RefuseInvalid = "invalid" // the request is invalid: ErrInvalid
	RefuseBusy    = "busy"    // the receive queue is full: ErrBusy
	RefuseStale   = "stale"   // the seq was given up: ErrStale
	// RefuseTooLarge: the notify is above the receiver's size limit: ErrNotifyTooLarge.
	RefuseTooLarge = "too_large"
)

// Refusal causes (ts_refuse_cause), beside a handshake's refusal code.
const (
	// CauseDevice: the responder's device cannot make a ctrl channel (its port is down,
	// the device failed, a verbs call failed), with RefuseLimit, which a peer that does not
	// read the cause acts on as it always did.
	CauseDevice = "device"
)

// maxRefuseLen bounds a ts_refuse code; codes this version does not know still decode
// (as plain ErrRejected) so a newer peer's refusal is not a bad frame.
const maxRefuseLen = 32

// RefusedError is a typed refusal: the peer answered with ts_refuse Code and the text Msg.
// A Handler replies with one (possibly wrapped) to send a refusal; a client gets one
// wrapped in its error. It matches ErrRejected and the sentinel of its Code with errors.Is.
type RefusedError struct {
	Code string
	Msg  string
}

func (e *RefusedError) Error() string {
	if e.Msg == "" {
		return "refused (" + e.Code + ")"
	}
	return "refused (" + e.Code + "): " + e.Msg
}

// Unwrap gives ErrRejected and, for a known code, its sentinel.
func (e *RefusedError) Unwrap() []error {
	if s := refuseSentinel(e.Code); s != nil {
		return []error{ErrRejected, s}
	}
	return []error{ErrRejected}
}

func refuseSentinel(code string) error {
	switch code {
	case RefuseNoCtrl:
		return ErrNoCtrl
	case RefuseLimit:
		return ErrLimit
	case RefuseAuth:
		return ErrAuth
	case RefuseClosed:
		return ErrPeerClosed
	case RefuseInvalid:
		return ErrInvalid
	case RefuseBusy:
		return ErrBusy
	case RefuseStale:
		return ErrStale
	case RefuseTooLarge:
		return ErrNotifyTooLarge
	}
	return nil
}

func validRefuseCode[T ~string | ~[]byte](s T) bool {
	if len(s) == 0 || len(s) > maxRefuseLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 'a' || c > 'z') && c != '_' {
			return false
		}
	}
	return true
}

// refusalOf splits a Handler's error into the code it carries (a *RefusedError in its
// chain, "" when none) and the text for reply_msg / ts_error (never empty).
func refusalOf(err error) (code, msg string) {
	var re *RefusedError
	if errors.As(err, &re) && validRefuseCode(re.Code) {
		code = re.Code
	}
	msg = err.Error()
	if msg == "" {
		msg = "rejected"
	}
	return code, msg
}

// newRefused builds the client's view of a refusal. The text a twosided server sends is
// the RefusedError's own Error(); its "refused (code): " prefix is dropped so the code is
// not said twice.
func newRefused(code, text string) *RefusedError {
	text = strings.TrimPrefix(text, "refused ("+code+")")
	text = strings.TrimPrefix(text, ": ")
	return &RefusedError{Code: code, Msg: text}
}
