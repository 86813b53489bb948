package notify

import "sync/atomic"

// deviceEventCounters count the device's async events and what they did.
type deviceEventCounters struct {
	portErr, portActive, deviceFatal, gidChange, other, channelsFailed atomic.Uint64
}
