package reactor

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBusyCountsWork: the time a callback works is in Stats.Busy once its iteration ends.
func TestBusyCountsWork(t *testing.T) {
	l := newLoop(t)
	const work = 2 * time.Millisecond
	onLoop(t, l, func() {
		deadline := time.Now().Add(work)
		for time.Now().Before(deadline) { // work, without sleeping
		}
	})
	require.NoError(t, l.Stop(context.Background()))
	require.GreaterOrEqual(t, l.Stats().Busy, work)
}
