package notify

import (
	"fmt"
	"time"
)

// peerLimits bound what peers, or anyone who can reach the OOB port, make the engine keep.
type peerLimits struct {
	maxPeers   int           // peer entries (remote sessions) [1024]
	maxNames   int           // names (addresses, aliases) [4096]
	gapTimeout time.Duration // a receive gap the sender never fills nor fences is given up after [60s]
	peerIdle   time.Duration // an idle peer without a channel is forgotten after [10m]
}

// WithMaxPeers caps the remote engines the engine keeps state for (1..1<<20, default
// 1024). A handshake from one more is refused with the code "limit"; idle peers without a
// channel are forgotten after WithPeerIdle.
func WithMaxPeers(n int) Option { return func(c *config) { c.peers.maxPeers = n } }

// WithMaxNames caps the peer names (addresses and aliases) the engine keeps (1..1<<20,
// default 4096). A send to one more name fails with ErrLimit.
func WithMaxNames(n int) Option { return func(c *config) { c.peers.maxNames = n } }

// WithGapTimeout bounds how long received notifies wait behind a missing seq that the
// sender neither sends nor gives up (it died): after d (1s..1h, default 60s) the missing
// seq is skipped and what waited behind it is delivered.
func WithGapTimeout(d time.Duration) Option { return func(c *config) { c.peers.gapTimeout = d } }

// WithPeerIdle forgets a peer without a channel and without traffic for d (1s..24h, default
// 10m); it handshakes again when it comes back.
func WithPeerIdle(d time.Duration) Option { return func(c *config) { c.peers.peerIdle = d } }

func (l *peerLimits) setDefaults() {
	if l.maxPeers == 0 {
		l.maxPeers = 1024
	}
	if l.maxNames == 0 {
		l.maxNames = 4096
	}
	if l.gapTimeout == 0 {
		l.gapTimeout = 60 * time.Second
	}
	if l.peerIdle == 0 {
		l.peerIdle = 10 * time.Minute
	}
}

func (l *peerLimits) validate() []error {
	l.setDefaults()
	var errs []error
	bad := func(field string, v any, want string) {
		errs = append(errs, fmt.Errorf("%w: %s: %v out of range %s", ErrConfig, field, v, want))
	}
	if l.maxPeers < 1 || l.maxPeers > 1<<20 {
		bad("max_peers", l.maxPeers, "1..1048576")
	}
	if l.maxNames < 1 || l.maxNames > 1<<20 {
		bad("max_names", l.maxNames, "1..1048576")
	}
	if l.gapTimeout < time.Second || l.gapTimeout > time.Hour {
		bad("gap_timeout", l.gapTimeout, "1s..1h")
	}
	if l.peerIdle < time.Second || l.peerIdle > 24*time.Hour {
		bad("peer_idle", l.peerIdle, "1s..24h")
	}
	return errs
}
