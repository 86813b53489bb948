package ctrlchannel

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLedgerCumulative(t *testing.T) {
	var l Ledger
	require.NoError(t, l.Reset(1, Credits{0, 4}))
	require.Equal(t, uint64(4), l.Available(RequestSlots))

	minted, err := l.Grant(1, RequestSlots, 6)
	require.NoError(t, err)
	require.Equal(t, uint64(2), minted)
	require.Equal(t, uint64(6), l.Available(RequestSlots))

	// The same total again, and an older one, mint nothing.
	for _, total := range []uint64{6, 5, 0} {
		minted, err = l.Grant(1, RequestSlots, total)
		require.NoError(t, err)
		require.Zero(t, minted)
		require.Equal(t, uint64(6), l.Available(RequestSlots))
	}
}

func TestLedgerEpochZeroInvalid(t *testing.T) {
	var l Ledger
	require.ErrorIs(t, l.Reset(0, Credits{}), ErrBadEpoch)
	_, err := l.Grant(0, RequestSlots, 10)
	require.ErrorIs(t, err, ErrBadEpoch)
	require.Zero(t, l.Available(RequestSlots))
}

func TestLedgerStaleEpoch(t *testing.T) {
	var l Ledger
	require.NoError(t, l.Reset(3, Credits{0, 4}))
	minted, err := l.Grant(2, RequestSlots, 100)
	require.ErrorIs(t, err, ErrStaleEpoch)
	require.Zero(t, minted)
	require.Equal(t, uint64(4), l.Available(RequestSlots))
}

func TestLedgerNewerEpochResets(t *testing.T) {
	var l Ledger
	require.NoError(t, l.Reset(1, Credits{0, 64}))
	require.True(t, l.Reserve(Credits{0, 60}))
	minted, err := l.Grant(2, RequestSlots, 8)
	require.NoError(t, err)
	require.Equal(t, uint64(8), minted)
	require.Equal(t, uint64(2), l.Epoch())
	require.Equal(t, uint64(8), l.Available(RequestSlots), "use of the old epoch is forgotten")
	require.Zero(t, l.Available(DataBytes))
}

func TestLedgerReserveAllOrNothing(t *testing.T) {
	var l Ledger
	require.NoError(t, l.Reset(1, Credits{100, 2}))
	require.False(t, l.Reserve(Credits{10, 3}), "RequestSlots short")
	require.Equal(t, uint64(100), l.Available(DataBytes), "nothing taken when one resource is short")
	require.Equal(t, uint64(2), l.Available(RequestSlots))
	require.True(t, l.Reserve(Credits{10, 2}))
	require.Equal(t, uint64(90), l.Available(DataBytes))
	require.Zero(t, l.Available(RequestSlots))
	require.False(t, l.Reserve(Credits{0, 1}))
	require.True(t, l.Reserve(Credits{}))
}

func TestLedgerRollback(t *testing.T) {
	var l Ledger
	require.NoError(t, l.Reset(1, Credits{0, 3}))
	require.True(t, l.Reserve(Credits{0, 3}))
	l.Rollback(Credits{0, 2})
	require.Equal(t, uint64(2), l.Available(RequestSlots))
	l.Rollback(Credits{0, 9}) // more than used: clamps at zero use
	require.Equal(t, uint64(3), l.Available(RequestSlots))
}

func TestLedgerReserveOneKeepsReserve(t *testing.T) {
	var l Ledger
	require.NoError(t, l.Reset(1, Credits{0, 2}))
	require.True(t, l.ReserveOne(RequestSlots, 1))
	require.False(t, l.ReserveOne(RequestSlots, 1), "the last unit is kept for credit frames")
	require.True(t, l.ReserveOne(RequestSlots, 0))
	require.False(t, l.ReserveOne(RequestSlots, 0))
}

func TestLedgerBadResource(t *testing.T) {
	var l Ledger
	_, err := l.Grant(1, 7, 1)
	require.ErrorContains(t, err, "resource 7")
}
