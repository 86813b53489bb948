package notify

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twosided/twosided/ctrlchannel"
	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/oob"
)

// ctrlNICPath is what Mooncake's ctrl handshake puts in peer_nic_path.
const ctrlNICPath = "__ctrl__"

func (e *Engine) channelConfig() ctrlchannel.Config {
	cfg := ctrlchannel.Config{
		RecvCount:       e.cfg.recvCount,
		BufSize:         e.cfg.bufferSize,
		MaxPendingSends: e.cfg.maxPendingSends,
		MaxNotifySize:   e.cfg.maxNotifySize,
		PortNum:         uint8(e.cfg.ibPort),
		GIDIndex:        e.cfg.gidIndex,
		// Fragmentation needs a RECV for credit frames beside the data window.
		Extensions:     e.cfg.recvCount >= 3,
		DisableCredits: e.cfg.noCredits,
		Logger:         e.cfg.logger,
	}
	if cfg.GIDIndex < 0 {
		cfg.GIDIndex = 0
	}
	if e.cfg.mtu != 0 {
		cfg.MTU, _ = ibv.MTUFromBytes(e.cfg.mtu)
	}
	return cfg
}

// machineConfig is the peer machine's configuration, from the engine's.
func (e *Engine) machineConfig() machineConfig {
	return machineConfig{
		channels:        e.cfg.transport == TransportRDMATwoSided && e.cfg.notifyEnabled,
		fallback:        e.cfg.oobFallback,
		maxNames:        e.cfg.peers.maxNames,
		maxPeers:        e.cfg.peers.maxPeers,
		maxChannels:     e.cfg.maxChannels,
		maxPendingSends: e.cfg.maxPendingSends,
		connectTimeout:  e.cfg.connectTimeout,
		gapTimeout:      e.cfg.peers.gapTimeout,
		peerIdle:        e.cfg.peers.peerIdle,
		maxNotifySize:   e.cfg.maxNotifySize,
	}
}

// startConnect performs aConnect: the handshake RPC, and for a channel (a.ch != 0) its QP
// before and its RTR/RTS after, all on a connect worker (connect_worker.go: the loop never
// blocks on a verb or the network); then finishConnect on the loop.
func (e *Engine) startConnect(a *mAction) {
	desc := &oob.HandshakeDesc{LocalNICPath: e.name + "@" + e.devName, PeerNICPath: ctrlNICPath,
		Session: e.session, Epoch: a.epoch, PeerName: e.name, Token: a.token, Proof: a.proof, To: a.session,
		MaxNotify: uint32(e.cfg.maxNotifySize)}
	name, id, epoch := a.name, a.ch, a.epoch
	timeout := e.cfg.connectTimeout
	if id == 0 {
		// A session handshake without channel: no verbs.
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			var out outbound
			out.resp, out.err = e.node.Handshake(ctx, name, desc)
			// The loop stopped: Close already failed every waiter.
			_ = e.handToLoop(func() { e.finishConnect(name, id, epoch, out) })
		}()
		return
	}
	if e.dev == nil || e.cfg.dev == nil {
		e.m.connected(e.loop.Now(), name, id, hsResult{err: fmt.Errorf("%w: no device open", ErrNoCtrlChannel)})
		return
	}
	cfg, dev, pd := e.channelConfig(), e.dev, e.pd
	e.goConnect(func(stop context.Context) {
		out := e.connectOut(stop, timeout, dev, pd, cfg, name, desc)
		if !e.handToLoop(func() { e.finishConnect(name, id, epoch, out) }) {
			out.prep.Release() // the loop stopped
			e.cfg.dev.workers.done()
		}
	})
}

// outbound is what a connect worker made of our handshake.
type outbound struct {
	resp     *oob.HandshakeDesc
	err      error                 // the handshake's
	prep     *ctrlchannel.Prepared // our channel (nil: none made)
	prepErr  error                 // our channel could not be made: the handshake went without one
	pi       ctrlchannel.PeerInfo  // the peer's channel, from resp
	readyErr error                 // the reply's channel fields, or our RTR/RTS, failed
}

// connectOut is a connect worker's part of our handshake with a channel: the QP in INIT,
// the RPC (bounded by timeout, and ended by the device's close), then RTR and RTS towards
// the channel of the reply, if it carries one.
func (e *Engine) connectOut(stop context.Context, timeout time.Duration, dev ibv.Context, pd ibv.PD, cfg ctrlchannel.Config, name string, desc *oob.HandshakeDesc) outbound {
	var out outbound
	ctx, cancel := context.WithTimeout(stop, timeout)
	defer cancel()
	p, err := ctrlchannel.Prepare(dev, pd, cfg)
	if err != nil {
		// Our device cannot make a channel now (its port is down, say): the handshake goes
		// without one all the same, so that the name learns which engine it leads to. Its
		// sends then join that pair in send order (over OOB where fallback allows), instead
		// of failing the name as if nobody served it while another name of the same engine
		// carries later sends past them.
		out.prepErr = fmt.Errorf("new ctrl channel: %w", err)
		out.resp, out.err = e.node.Handshake(ctx, name, desc)
		return out
	}
	out.prep = p
	fillChannelDesc(desc, p.Local())
	out.resp, out.err = e.node.Handshake(ctx, name, desc)
	if replyHasChannel(out.resp, out.err) {
		if out.pi, out.readyErr = peerInfoFrom(out.resp); out.readyErr == nil {
			out.readyErr = e.ready(p, out.pi)
		}
	}
	return out
}

// replyHasChannel reports whether our handshake's reply accepts it with a channel of the
// peer's for ours to connect to.
func replyHasChannel(resp *oob.HandshakeDesc, err error) bool {
	return err == nil && resp != nil && resp.CtrlChannel && resp.NotifyQPNum != 0
}

func (e *Engine) finishConnect(name string, id chanID, epoch uint64, out outbound) {
	if id != 0 {
		defer e.cfg.dev.workers.done() // after the channel was adopted or released
	}
	defer out.prep.Release() // not adopted: released (after adoption it does nothing)
	if e.closing {
		return
	}
	resp, err := out.resp, out.err
	res := hsResult{}
	var re *oob.RefusedError
	switch {
	case err == nil:
	case errors.As(err, &re) && resp != nil && resp.Session != 0:
		res.refuse, res.refuseMsg, res.refuseCause = re.Code, boundName(re.Msg), resp.RefuseCause
	case errors.As(err, &re) && resp != nil && (re.Code == oob.RefuseLimit || re.Code == oob.RefuseBusy):
		// The peer's OOB node shed the handshake before its engine saw it: back off.
		kind := ErrBackpressure
		if re.Code == oob.RefuseLimit {
			kind = ErrLimit
		}
		e.m.connectShed(e.loop.Now(), name, id, kind, err)
		e.perform()
		return
	case errors.Is(err, oob.ErrRejected) && resp != nil:
		// A Mooncake engine (or one without the ctrl fields) said no in words: it has no
		// ctrl channel for us; its OOB path serves.
		res.noCtrlMsg = resp.ReplyMsg
		resp = &oob.HandshakeDesc{}
	default:
		// A limit the peer's port said, or an auth failure, keeps its sentinel; anything
		// else (refused, timed out, broken) is an unreachable peer.
		res.err = oobKind(err)
		if k := res.err.(*kindError); k.kind != ErrLimit && k.kind != ErrAuth && k.kind != ErrBackpressure {
			k.kind = ErrPeerUnreachable
		}
	}
	if res.err == nil && resp != nil {
		res.session, res.token, res.epoch, res.peerName = resp.Session, resp.Token, resp.Epoch, boundName(resp.PeerName)
		res.fresh, res.maxNotify = resp.Fresh, int(resp.MaxNotify)
		if out.prepErr != nil && res.refuse == "" {
			// Answered without our channel: the engine is known; ours failed, not the peer.
			res.localErr = fmt.Errorf("local: %w", out.prepErr)
		}
		if res.refuse == "" && id != 0 && replyHasChannel(resp, nil) && out.prep != nil {
			switch {
			case out.readyErr != nil:
				// Ours failed (a verbs call, our resources), or the reply's channel
				// fields could not be used: not the peer's refusal.
				res.localErr = fmt.Errorf("local: %w", out.readyErr)
			case !e.m.chanWanted(id):
				// The machine let the channel go while it was made: released.
			default:
				if cerr := e.connectChannel(id, out.prep, out.pi, resp.Session, epoch); cerr != nil {
					res.localErr = fmt.Errorf("local: %w", cerr)
				} else {
					res.ctrl = true
				}
			}
		}
	} else if res.err == nil {
		res.err = fmt.Errorf("%w: empty handshake reply", ErrRejected)
	}
	e.m.connected(e.loop.Now(), name, id, res)
	e.perform()
}

// connectChannel adopts the ready p as channel id towards the peer channel pi.
func (e *Engine) connectChannel(id chanID, p *ctrlchannel.Prepared, pi ctrlchannel.PeerInfo, peerSession, epoch uint64) error {
	ch, err := e.adoptChannel(id, p, peerSession, epoch)
	if err != nil {
		return err
	}
	e.remote[id] = pi.QPN
	e.m.setChanLimit(id, ch.MaxNotify())
	return nil
}

// boundName keeps a peer-given name within the length a name may have.
func boundName(s string) string {
	if len(s) > oob.MaxFromLen {
		return strings.Clone(s[:oob.MaxFromLen]) // not a view that keeps a huge request alive
	}
	return s
}

// fillChannelDesc adds our channel's side (l) of the Connection RPC, in Mooncake's field
// names plus ts_*.
func fillChannelDesc(d *oob.HandshakeDesc, l ctrlchannel.LocalInfo) {
	d.LocalLID, d.LocalGID = l.LID, l.GID.String()
	d.CtrlChannel, d.NotifyQPNum, d.NotifyRQDepth = true, l.QPN, l.RQDepth
	d.MTU, d.PSN, d.BufSize, d.Extensions = uint32(l.MTU.Bytes()), l.PSN, l.BufSize, l.Extensions
}

// peerInfoFrom reads the remote channel's parameters out of a handshake message, checking
// each field.
func peerInfoFrom(d *oob.HandshakeDesc) (ctrlchannel.PeerInfo, error) {
	var pi ctrlchannel.PeerInfo
	if !d.CtrlChannel {
		return pi, fmt.Errorf("%w: ctrl_channel: not set", ErrNoCtrlChannel)
	}
	if d.NotifyQPNum == 0 {
		return pi, fmt.Errorf("%w: notify_qp_num: 0", ErrInvalid)
	}
	if d.NotifyRQDepth == 0 {
		return pi, fmt.Errorf("%w: notify_rq_depth: 0", ErrInvalid)
	}
	gid, err := ibv.ParseGID(d.LocalGID)
	if err != nil {
		return pi, fmt.Errorf("%w: local_gid: %v", ErrInvalid, err)
	}
	pi = ctrlchannel.PeerInfo{
		QPN: d.NotifyQPNum, GID: gid, LID: d.LocalLID, RQDepth: d.NotifyRQDepth,
		PSN: d.PSN, BufSize: d.BufSize, Extensions: d.Extensions, MaxNotifySize: d.MaxNotify,
		Legacy: d.Session == 0, // a Mooncake PR #3440 engine: no ts_session
	}
	switch {
	case d.MTU == 0: // a Mooncake peer does not say: assume the IB default of Mooncake (4096), capped by ours
		pi.MTU = ibv.MTU4096
	default:
		m, err := ibv.MTUFromBytes(int(d.MTU))
		if err != nil {
			return pi, fmt.Errorf("%w: ts_mtu: %v", ErrInvalid, err)
		}
		pi.MTU = m
	}
	if pi.BufSize == 0 {
		pi.BufSize = 4096 // Mooncake's MC_RDMA_NOTIFY_BUFFER_SIZE default
	}
	return pi, nil
}

// peerNameOf is the peer's name from a handshake: ts_peer_name, else the server part of
// local_nic_path ("server@device").
func peerNameOf(d *oob.HandshakeDesc) string {
	if d.PeerName != "" {
		return d.PeerName
	}
	if i := strings.LastIndexByte(d.LocalNICPath, '@'); i > 0 {
		return d.LocalNICPath[:i]
	}
	return d.LocalNICPath
}

// oobHandler is the engine's side of the OOB node. Its methods run on the loop.
type oobHandler Engine

func (h *oobHandler) HandleNotify(req *oob.NotifyRequest, reply oob.NotifyReply) {
	e := (*Engine)(h)
	if e.closing || !e.started {
		reply.Send(&oob.RefusedError{Code: oob.RefuseClosed, Msg: "engine closing"})
		return
	}
	// A probe (a twosided notify with neither seq nor fence) delivers nothing: it is
	// answered at once, also while the queue is full, so a sender stalled on credit learns
	// that this engine is alive (Engine.probePeer).
	probe := req.Session != 0 && req.Seq == 0 && req.SkipCount == 0
	if (e.paused || len(e.heldOOB) > 0) && !probe {
		// Held, answered when taken; or "busy": the sender sends it again after an answer
		// (nothing is lost). The machine decides (oobHold).
		hold, pair := e.m.oobHold(req.Session, req.Token, len(e.heldOOB))
		if !hold {
			e.oobBusy++
			reply.Send(&oob.RefusedError{Code: oob.RefuseBusy, Msg: "receive queue full"})
			return
		}
		e.heldOOB = append(e.heldOOB, heldNotify{req: *req, reply: reply, pair: pair})
		return
	}
	e.takeOOB(req, reply)
}

// takeOOB hands an OOB notify to the machine and answers it.
func (e *Engine) takeOOB(req *oob.NotifyRequest, reply oob.NotifyReply) {
	if sz := len(req.Name) + len(req.Msg); sz > e.cfg.maxNotifySize {
		// Received notifies keep the send rule: a sender that ignores it is told, and its
		// seq (if any) is given up by it, not waited for here.
		reply.Send(&oob.RefusedError{Code: oob.RefuseTooLarge, Msg: fmt.Sprintf("name+msg is %d bytes, this engine's max_notify_size is %d", sz, e.cfg.maxNotifySize)})
		return
	}
	code, err := e.m.oobArrive(e.loop.Now(), oobArrival{session: req.Session, token: req.Token, to: req.To,
		seq: req.Seq, skipFrom: req.SkipFrom, skipN: req.SkipCount, nid: req.ID, from: boundName(req.From),
		n: Notify{Name: req.Name, Msg: req.Msg, ID: req.ID}})
	e.perform()
	if code != "" {
		reply.Send(&oob.RefusedError{Code: code, Msg: err.Error()})
		return
	}
	reply.Send(nil)
}

func (h *oobHandler) HandleHandshake(req *oob.HandshakeDesc, reply func(*oob.HandshakeDesc, error)) {
	e := (*Engine)(h)
	refuse := func(code string, err error) {
		reply(&oob.HandshakeDesc{Refuse: code, ReplyMsg: err.Error(), Session: e.session, PeerName: e.name}, nil)
	}
	if e.closing || !e.started {
		refuse(oob.RefuseClosed, ErrClosed)
		return
	}
	name := boundName(peerNameOf(req))
	ctrl := req.CtrlChannel && req.NotifyQPNum != 0
	var pi ctrlchannel.PeerInfo
	if ctrl {
		var err error
		if pi, err = peerInfoFrom(req); err != nil {
			refuse(oob.RefuseInvalid, err)
			return
		}
	}
	dec := e.m.inbound(e.loop.Now(), inboundHS{name: name, session: req.Session, token: req.Token,
		proof: req.Proof, epoch: req.Epoch, ctrl: ctrl, maxNotify: int(req.MaxNotify), from: req.Remote})
	defer e.perform()
	if dec.refuse != "" {
		err := dec.err
		if err == nil {
			err = fmt.Errorf("refused: %s", dec.refuse)
		}
		reply(&oob.HandshakeDesc{Refuse: dec.refuse, ReplyMsg: err.Error(), Session: e.session, Token: dec.token,
			Epoch: dec.epoch, PeerName: e.name, Fresh: dec.fresh, MaxNotify: uint32(e.cfg.maxNotifySize)}, nil)
		return
	}
	resp := &oob.HandshakeDesc{LocalNICPath: e.name + "@" + e.devName, PeerNICPath: req.LocalNICPath,
		Session: e.session, Token: dec.token, Epoch: dec.epoch, PeerName: e.name, Fresh: dec.fresh,
		MaxNotify: uint32(e.cfg.maxNotifySize)}
	if dec.ch == 0 {
		reply(resp, nil) // a session without channel
		return
	}
	if e.dev == nil || e.cfg.dev == nil {
		e.inboundRefused(dec.ch, dec.fresh, inboundHS{name: name, session: req.Session}, resp, fmt.Errorf("%w: no device open", ErrNoCtrlChannel), reply)
		return
	}
	// The channel is made and connected on a connect worker; the reply waits for it (the
	// OOB node's max_pending_handshakes bounds such replies).
	in := inboundConnect{id: dec.ch, epoch: dec.epoch, fresh: dec.fresh, hs: inboundHS{name: name, session: req.Session},
		pi: pi, resp: resp, reply: reply}
	cfg, dev, pd := e.channelConfig(), e.dev, e.pd
	e.goConnect(func(context.Context) {
		p, err := ctrlchannel.Prepare(dev, pd, cfg)
		if err != nil {
			err = fmt.Errorf("new ctrl channel: %w", err)
		} else {
			err = e.ready(p, in.pi)
		}
		if !e.handToLoop(func() { e.finishInbound(in, p, err) }) {
			p.Release() // the loop stopped
			in.reply(&oob.HandshakeDesc{Refuse: oob.RefuseClosed, ReplyMsg: ErrClosed.Error(), Session: e.session}, nil)
			e.cfg.dev.workers.done()
		}
	})
}

// inboundConnect is a peer's accepted handshake whose channel a connect worker makes.
type inboundConnect struct {
	id    chanID
	epoch uint64
	fresh bool
	hs    inboundHS
	pi    ctrlchannel.PeerInfo
	resp  *oob.HandshakeDesc
	reply func(*oob.HandshakeDesc, error)
}

// finishInbound adopts the channel a worker made for a peer's handshake (p, ready unless
// err) and answers the handshake. Loop-only.
func (e *Engine) finishInbound(in inboundConnect, p *ctrlchannel.Prepared, err error) {
	defer e.cfg.dev.workers.done() // after the channel was adopted or released
	defer p.Release()              // not adopted: released (after adoption it does nothing)
	if e.closing {
		in.reply(&oob.HandshakeDesc{Refuse: oob.RefuseClosed, ReplyMsg: ErrClosed.Error(), Session: e.session, PeerName: e.name}, nil)
		return
	}
	defer e.perform()
	var ch *ctrlchannel.Channel
	switch {
	case err != nil:
	case !e.m.chanWanted(in.id):
		err = errors.New("the channel's entry went while it was made")
	default:
		ch, err = e.adoptChannel(in.id, p, in.hs.session, in.epoch)
	}
	if err != nil {
		e.inboundRefused(in.id, in.fresh, in.hs, in.resp, err, in.reply)
		return
	}
	e.remote[in.id] = in.pi.QPN
	e.m.setChanLimit(in.id, ch.MaxNotify())
	e.m.inboundUp(e.loop.Now(), in.id, nil)
	fillChannelDesc(in.resp, ch.Local())
	in.reply(in.resp, nil)
}

// inboundRefused answers a peer's handshake whose channel failed on our side. Loop-only.
func (e *Engine) inboundRefused(id chanID, fresh bool, hs inboundHS, resp *oob.HandshakeDesc, err error, reply func(*oob.HandshakeDesc, error)) {
	// Our own device failed (a port down, a device fatal, a QP, a CQ, an fd, a verbs
	// call), not the peer's request. On the wire it stays a "limit" refusal, which every
	// twosided peer acts on (it asks again after its backoff, and with fallback on is
	// served over OOB meanwhile: the reply carries a token, the pair's or a cookie when
	// the entry went with the channel), with the cause "device" beside it, which tells a
	// peer that reads it that this is no cap: ErrNoCtrlChannel. The machine learns it
	// before the reply goes.
	resp.Token = e.m.inboundFailed(e.loop.Now(), id, fresh, hs)
	resp.Refuse, resp.RefuseCause = oob.RefuseLimit, oob.CauseDevice
	resp.ReplyMsg = fmt.Sprintf("cannot make a ctrl channel here: %v", err)
	reply(resp, nil)
}

// HandlePeerGone: a twosided peer said goodbye on OOB (it closed). A pair with nothing in
// flight and no channel is forgotten at once; a channel learns of the close by its own
// SESSION_CLOSE.
func (h *oobHandler) HandlePeerGone(addr string, session uint64) {
	e := (*Engine)(h)
	if e.closing {
		return
	}
	e.m.peerGone(e.loop.Now(), boundName(addr), session)
	e.perform()
}

var _ oob.PeerGoneHandler = (*oobHandler)(nil)
