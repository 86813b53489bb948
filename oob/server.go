package oob

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/twosided/twosided/internal/tracepoint"
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
		p, err := n.pd.decode(body)
		if err != nil {
			c.reject(t, p.m, err)
			return
		}
		n.st.probeServed.Add(1)
		if p.bye != 0 && c.persistent {
			// The client's Node is closing: free the connection now. Its name is trusted
			// only where a required key was proved.
			n.st.byesReceived.Add(1)
			c.close(nil)
			if (n.auth.required && c.auth.state == authOK) || sameHost(p.from, c.remote) {
				n.peerGone(p.from, p.session)
			}
			return
		}
		switch {
		case c.frames == 1 && p.hello >= helloVersion:
			c.persistent = true
			if n.auth.on {
				newNonce(&c.auth.local)
				c.auth.state = authPending
				c.auth.peer, c.auth.peerNonce = p.nonce, p.hasNonce
			}
			n.out = appendHelloReply(n.out[:0], p.m, &n.auth, &c.auth, n.cfg.MaxFrame)
		case p.hasMAC:
			if c.auth.state != authPending || !c.auth.peerNonce {
				n.noteAuthFailed()
				c.refuse(t, p.m, errAuthUnexpect)
				return
			}
			if !n.auth.verify(dirClient, &c.auth.peer, &c.auth.local, &p.mac) {
				n.noteAuthFailed()
				n.log.Debug().Int("fd", c.fd).Msg("oob: client proof does not match AuthKey")
				c.refuse(t, p.m, errAuthFailed)
				return
			}
			c.auth.state = authOK
			c.parser.MaxFrame = n.cfg.MaxFrame
			n.st.authOK.Add(1)
			n.out = appendProbe(n.out[:0], p.m, false)
		default:
			n.out = appendProbe(n.out[:0], p.m, false)
		}
		c.sendReply(n.out)
	case TypeNotify, TypeNotifyCompact:
		var (
			req *NotifyRequest
			m   reqMeta
			err error
		)
		switch {
		case t == TypeNotify:
			req, m, err = n.nd.decode(body)
		case !c.persistent:
			err = compactErr(fCompact, "a compact notify on a connection that did not say hello (the hello reply offers the form)")
		default:
			req, m, err = n.nd.decodeCompact(body)
		}
		if err != nil {
			c.reject(t, m, err)
			return
		}
		if !c.admitted(t, m) {
			return
		}
		if len(c.open) >= n.cfg.MaxOpenRequests {
			// The Handler holds this many of the connection's requests already: answer
			// "busy" rather than hold more (the peer-fed map stays bounded).
			n.st.busyRefused.Add(1)
			n.warn(warnBusy, c.remote.String())
			n.out = appendNotifyReply(n.out[:0], m, &RefusedError{Code: RefuseBusy,
				Msg: fmt.Sprintf("%d requests on this connection await the receiver: max_open_requests %d", len(c.open), n.cfg.MaxOpenRequests)})
			c.sendReply(n.out)
			return
		}
		n.st.notifyServed.Add(1)
		// Msg is the Handler's to keep (it is delivered to the application as is), carved
		// from the node's slab; the request struct and its strings come from the reused
		// decoder.
		req.Msg = n.slab.Copy(req.Msg)
		tracepoint.Mark(tracepoint.Handle, len(req.Msg))
		n.h.HandleNotify(req, NotifyReply{c: c, seq: c.openRequest(), m: m})
	case TypeConnection, TypeOldProtocol:
		// A frame without a type byte is Mooncake's older protocol: a Connection request,
		// answered without a type byte (as Mooncake's daemon does).
		d, m, err := decodeHandshake(body)
		m.old = t == TypeOldProtocol
		if err != nil {
			c.reject(t, m, err)
			return
		}
		if !c.admitted(t, m) {
			return
		}
		if m.old {
			n.st.oldProtocol.Add(1)
		}
		if n.shaking >= n.cfg.MaxPendingHandshakes {
			n.st.handshakeLimited.Add(1)
			n.warn(warnHandshakes, c.remote.String())
			c.refuseHandshake(m, errTooManyShakes.Error())
			return
		}
		if n.shakingBy[c.remote] >= n.cfg.MaxPendingHandshakesPerAddr {
			n.st.handshakeLimitedByAddr.Add(1)
			n.warn(warnHandshakesByAddr, c.remote.String())
			c.refuseHandshake(m, fmt.Sprintf("too many pending handshakes from %s: max_pending_handshakes_per_addr %d", c.remote, n.cfg.MaxPendingHandshakesPerAddr))
			return
		}
		n.st.handshakeServed.Add(1)
		n.shaking++
		n.st.pendingHS.Add(1)
		if n.shakingBy[c.remote]++; n.shakingBy[c.remote] == 1 {
			n.st.shakingAddrs.Add(1)
		}
		seq := c.openRequest()
		d.Remote = c.remote
		n.h.HandleHandshake(d, func(resp *HandshakeDesc, err error) {
			if n.loop.InLoop() {
				c.replyHandshake(seq, m, resp, err)
				return
			}
			n.submitReply(func() { c.replyHandshake(seq, m, resp, err) })
		})
	default: // TypeMetadata; the parser already refused unknown types
		c.reject(t, reqMeta{}, errMetadataNotServed)
	}
}

// refuseHandshake answers one handshake over a limit with reply_msg text and, for a
// twosided peer, ts_refuse "limit"; the connection keeps serving.
func (c *conn) refuseHandshake(m reqMeta, msg string) {
	c.sendHandshake(&HandshakeDesc{ReplyMsg: msg, Refuse: RefuseLimit}, m)
}

// sendHandshake writes a handshake reply: to a Mooncake peer only Mooncake's members and
// the ctrl-channel additions; a classic connection then drains.
func (c *conn) sendHandshake(d *HandshakeDesc, m reqMeta) {
	n := c.n
	if !m.twosided {
		d.stripExtensions()
	}
	n.out = appendHandshake(n.out[:0], d, m)
	c.sendReply(n.out)
}

// sendReply writes a reply; a classic connection (one request) then drains.
func (c *conn) sendReply(b []byte) {
	c.send(b)
	if !c.persistent {
		c.drain()
	}
}

// admitted reports whether a Notify or Connection request may reach the Handler: with a
// required key only on a connection whose client proved it. A refused request gets the
// error reply "authentication required" and the connection is closed.
func (c *conn) admitted(t MsgType, m reqMeta) bool {
	n := c.n
	if !n.auth.required || c.auth.state == authOK {
		return true
	}
	n.noteAuthFailed()
	n.log.Debug().Int("fd", c.fd).Stringer("type", t).Msg("oob: unauthenticated request refused")
	c.refuse(t, m, errAuthRequired)
	return false
}

// submitReply runs a Handler's reply given off the loop on the loop, waiting for queue
// room up to RequestTimeout when the queue is full.
func (n *Node) submitReply(f func()) {
	if err := n.loop.Submit(f); errors.Is(err, reactor.ErrQueueFull) {
		ctx, cancel := context.WithTimeout(context.Background(), n.cfg.RequestTimeout)
		_ = n.loop.SubmitWait(ctx, f)
		cancel()
	}
}

// openRequest notes a request handed to the Handler; its reply closes it, once.
func (c *conn) openRequest() uint64 {
	if c.open == nil {
		c.open = make(map[uint64]struct{}, 1)
	}
	c.reqSeq++
	c.open[c.reqSeq] = struct{}{}
	return c.reqSeq
}

// replyDone reports whether the reply for request seq should be written: the first reply
// to a request still open on a connection still serving.
func (c *conn) replyDone(seq uint64) bool {
	if !c.closeRequest(seq) {
		return false
	}
	return c.state != stateClosed && c.state != stateDraining
}

// closeRequest closes request seq; false when it was answered already.
func (c *conn) closeRequest(seq uint64) bool {
	if _, ok := c.open[seq]; !ok {
		return false
	}
	delete(c.open, seq)
	return true
}

func (c *conn) replyNotify(seq uint64, m reqMeta, err error) {
	if !c.replyDone(seq) {
		return
	}
	n := c.n
	n.out = appendNotifyReply(n.out[:0], m, err)
	c.sendReply(n.out)
	c.touch()
}

func (c *conn) replyHandshake(seq uint64, m reqMeta, resp *HandshakeDesc, err error) {
	n := c.n
	if !c.closeRequest(seq) {
		return
	}
	// The Handler is done with it, whether or not the connection is still there.
	n.shaking--
	n.st.pendingHS.Add(-1)
	if n.shakingBy[c.remote]--; n.shakingBy[c.remote] <= 0 {
		delete(n.shakingBy, c.remote)
		n.st.shakingAddrs.Add(-1)
	}
	if c.state == stateClosed || c.state == stateDraining {
		return
	}
	var d HandshakeDesc
	if resp != nil {
		d = *resp
	}
	if err != nil {
		code, msg := refusalOf(err)
		d.ReplyMsg = msg
		if code != "" {
			d.Refuse = code
		}
	}
	if d.Refuse != "" && !validRefuseCode(d.Refuse) {
		d.Refuse = RefuseInvalid // a Handler's bad code must not make the reply undecodable
	}
	if d.Refuse != "" && d.ReplyMsg == "" {
		d.ReplyMsg = d.Refuse
	}
	c.sendHandshake(&d, m)
	c.touch()
}

// sameHost reports whether the name a bye carries is on the IP the bye came from: without
// a proved key, a bye may free state only of a name on the connection's own host, so a
// third party cannot close another engine's channels by naming it.
func sameHost(name string, remote netip.Addr) bool {
	host, _, err := net.SplitHostPort(name)
	if err != nil || !remote.IsValid() {
		return false
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return false // a host name: not checked here, so not trusted
	}
	return ip.Unmap() == remote.Unmap()
}
