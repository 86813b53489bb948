package ctrlchannel

import "errors"

// Errors of the channel. Callers test them with errors.Is; each is wrapped with context.
var (
	// ErrClosed: the channel is closed; wraps the cause given to Close when there is one.
	ErrClosed = errors.New("ctrlchannel: closed")
	// ErrBackpressure: MaxPendingSends sends are already queued or in flight.
	ErrBackpressure = errors.New("ctrlchannel: too many pending sends")
	// ErrTooLarge: name+msg is above MaxNotifySize, or does not fit one RECV buffer of a
	// peer that cannot reassemble fragments.
	ErrTooLarge = errors.New("ctrlchannel: notify too large")
	// ErrPeerError: a work completion failed (the peer is gone, the QP went to error);
	// it wraps the *ibv.WCError.
	ErrPeerError = errors.New("ctrlchannel: work completion failed")
	// ErrBadEpoch: epoch 0, which no session uses.
	ErrBadEpoch = errors.New("ctrlchannel: epoch 0 is invalid")
	// ErrStaleEpoch: a credit grant of an epoch older than the ledger's.
	ErrStaleEpoch = errors.New("ctrlchannel: stale epoch")
	// ErrPeerClosed: the peer closed the session (SESSION_CLOSE); everything it sent
	// before was delivered.
	ErrPeerClosed = errors.New("ctrlchannel: peer closed the session")
	// ErrConfig: a bad Config or Params field.
	ErrConfig = errors.New("ctrlchannel: bad config")
)
