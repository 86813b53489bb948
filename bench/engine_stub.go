//go:build !withengine

package bench

import (
	"context"
	"errors"
)

type nodeOpts struct {
	busyPoll int64
	size     int
	window   int
	single   bool
}

func newEngineNode(string, nodeOpts, *sink) (node, error) { return nil, errors.New("no engine yet") }

var _ = context.Background
