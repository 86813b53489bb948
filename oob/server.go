package oob

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/twosided/twosided/reactor"
)

var errMetadataNotServed = errors.New("metadata exchange (type 1) is not served by twosided")

// serveFrame handles one request on an accepted connection.
func (c *conn) serveFrame(t MsgType, body []byte) {
	n := c.n
	c.frames++
	if !c.persistent && c.frames > 1 {
		return // classic: one request per connection, as Mooncake's daemon reads
	}
	switch t {
	case TypeProbe:
		hello, m, key, err := probeDecode(body, n.key)
		n.key = key
		if err != nil {
			c.reject(t, m, err)
			return
		}
		n.st.probeServed.Add(1)
		if c.frames == 1 && hello >= helloVersion {
			c.persistent = true
			n.out = appendProbe(n.out[:0], m, true)
		} else {
			n.out = appendProbe(n.out[:0], m, false)
		}
		c.send(n.out)
		if !c.persistent {
			c.drain()
		}
	case TypeNotify:
		req, m, err := n.nd.decode(body)
		if err != nil {
			c.reject(t, m, err)
			return
		}
		n.st.notifyServed.Add(1)
		c.inflight++
		var once atomic.Bool
		n.h.HandleNotify(req, func(err error) {
			if once.CompareAndSwap(false, true) {
				n.onLoop(func() { c.replyNotify(m, err) })
			}
		})
	case TypeConnection:
		d, m, err := decodeHandshake(body)
		if err != nil {
			c.reject(t, m, err)
			return
		}
		n.st.handshakeServed.Add(1)
		c.inflight++
		var once atomic.Bool
		n.h.HandleHandshake(d, func(resp *HandshakeDesc, err error) {
			if once.CompareAndSwap(false, true) {
				n.onLoop(func() { c.replyHandshake(m, resp, err) })
			}
		})
	default: // TypeMetadata; the parser already refused unknown types
		c.reject(t, reqMeta{}, errMetadataNotServed)
	}
}

// onLoop runs f on the loop: now when called there, else submitted (waiting for queue
// room up to RequestTimeout when the queue is full).
func (n *Node) onLoop(f func()) {
	if n.loop.InLoop() {
		f()
		return
	}
	if err := n.loop.Submit(f); err != nil && !errors.Is(err, reactor.ErrStopped) {
		ctx, cancel := context.WithTimeout(context.Background(), n.cfg.RequestTimeout)
		_ = n.loop.SubmitWait(ctx, f)
		cancel()
	}
}

func (c *conn) replyDone() bool {
	if c.state == stateClosed || c.state == stateDraining {
		return false
	}
	c.inflight--
	return true
}

func (c *conn) replyNotify(m reqMeta, err error) {
	if !c.replyDone() {
		return
	}
	n := c.n
	if err != nil {
		n.out = appendNotifyReply(n.out[:0], m, err.Error(), true)
	} else {
		n.out = appendNotifyReply(n.out[:0], m, "", false)
	}
	c.send(n.out)
	if !c.persistent {
		c.drain()
	}
}

func (c *conn) replyHandshake(m reqMeta, resp *HandshakeDesc, err error) {
	if !c.replyDone() {
		return
	}
	n := c.n
	var d HandshakeDesc
	if resp != nil {
		d = *resp
	}
	if err != nil {
		d.ReplyMsg = err.Error()
		if d.ReplyMsg == "" {
			d.ReplyMsg = "rejected"
		}
	}
	if !m.twosided {
		// A Mooncake peer gets Mooncake's members and the ctrl-channel additions only.
		d.MTU, d.PSN, d.Session, d.Epoch, d.BufSize, d.Extensions, d.PeerName = 0, 0, 0, 0, 0, false, ""
	}
	n.out = appendHandshake(n.out[:0], &d, m)
	c.send(n.out)
	if !c.persistent {
		c.drain()
	}
}
