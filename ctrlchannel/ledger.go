package ctrlchannel

import "fmt"

// Credits holds one amount per resource, indexed by Resource-1.
type Credits [MaxGrantEntries]uint64

// Of returns the amount of resource r.
func (c *Credits) Of(r Resource) uint64 { return c[r-1] }

// Ledger is the sender's view of the credit a peer granted it in one epoch. Grants are
// cumulative totals: a duplicate or older total never mints credit; a grant of a newer
// epoch resets the ledger; epoch 0 is invalid. Reserve takes credit all-or-nothing and
// Rollback returns what a reserved send did not use.
type Ledger struct {
	epoch   uint64
	granted Credits
	used    Credits
}

// Reset starts epoch with the initial credit (the window the handshake announced).
func (l *Ledger) Reset(epoch uint64, initial Credits) error {
	if epoch == 0 {
		return fmt.Errorf("ledger reset: %w", ErrBadEpoch)
	}
	*l = Ledger{epoch: epoch, granted: initial}
	return nil
}

// Epoch is the ledger's epoch (0 before the first Reset or grant).
func (l *Ledger) Epoch() uint64 { return l.epoch }

// Grant applies a cumulative total of resource r granted in epoch and returns the credit
// it minted. A grant of an older epoch mints nothing and returns ErrStaleEpoch.
func (l *Ledger) Grant(epoch uint64, r Resource, total uint64) (uint64, error) {
	if epoch == 0 {
		return 0, fmt.Errorf("credit grant %s: %w", r, ErrBadEpoch)
	}
	if !r.Valid() {
		return 0, fmt.Errorf("%w: credit grant resource %d: want 1..4", ErrFrame, uint16(r))
	}
	if epoch < l.epoch {
		return 0, fmt.Errorf("credit grant %s epoch %d: ledger is at epoch %d: %w", r, epoch, l.epoch, ErrStaleEpoch)
	}
	if epoch > l.epoch {
		*l = Ledger{epoch: epoch}
	}
	i := r - 1
	if total <= l.granted[i] {
		return 0, nil
	}
	minted := total - l.granted[i]
	l.granted[i] = total
	return minted, nil
}

// Available is the unreserved credit of resource r.
func (l *Ledger) Available(r Resource) uint64 {
	i := r - 1
	if l.used[i] >= l.granted[i] {
		return 0
	}
	return l.granted[i] - l.used[i]
}

// Granted is the cumulative total granted for r in this epoch.
func (l *Ledger) Granted(r Resource) uint64 { return l.granted[r-1] }

// Reserve takes want from every resource, or nothing when any one is short.
func (l *Ledger) Reserve(want Credits) bool {
	for i := range want {
		if want[i] > 0 && l.Available(Resource(i+1)) < want[i] {
			return false
		}
	}
	for i := range want {
		l.used[i] += want[i]
	}
	return true
}

// ReserveOne takes one unit of r when more than keep units are available.
func (l *Ledger) ReserveOne(r Resource, keep uint64) bool {
	if l.Available(r) <= keep {
		return false
	}
	l.used[r-1]++
	return true
}

// Rollback returns reserved credit that was not used (a send that could not be posted).
// It never takes the ledger below zero use.
func (l *Ledger) Rollback(c Credits) {
	for i := range c {
		if c[i] > l.used[i] {
			l.used[i] = 0
			continue
		}
		l.used[i] -= c[i]
	}
}
