package oob

import "errors"

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
)
