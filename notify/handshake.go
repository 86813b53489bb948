package notify

import (
	"fmt"
	"strings"

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

// adopt makes ch, connected at epoch to the peer's session and QPN, p's channel, from
// either side of the handshake: it starts paused while the receive queue is full, and the
// sends that waited for it go out. Loop-only.
func (e *Engine) adopt(p *peer, ch *ctrlchannel.Channel, epoch, session uint64, remoteQPN uint32) {
	if e.paused {
		ch.SetPaused(true)
	}
	e.forgetSession(p, session)
	p.ch, p.epoch, p.state, p.lastErr, p.remoteQPN = ch, epoch, stateUp, nil, remoteQPN
	p.flush()
	e.armKeepalive()
}

func (e *Engine) channelLimitErr() error {
	return fmt.Errorf("%w: max_channels: %d channels open, the limit", ErrLimit, e.cfg.maxChannels)
}

// forgetSession drops the duplicate filter of p's previous session when p comes back with
// a new one (it restarted): the old process can send nothing more. Loop-only.
func (e *Engine) forgetSession(p *peer, session uint64) {
	if p.remoteSession != 0 && p.remoteSession != session {
		delete(e.dedup, p.remoteSession)
	}
	p.remoteSession = session
}

// channels counts established channels. Loop-only.
func (e *Engine) channels() int {
	n := 0
	for _, p := range e.peers {
		if p.ch != nil {
			n++
		}
	}
	return n
}

// newChannel creates a channel in INIT, its RECVs posted, bound to p. Loop-only.
func (e *Engine) newChannel(p *peer) (*ctrlchannel.Channel, error) {
	if e.dev == nil {
		return nil, fmt.Errorf("%w: no device open", ErrNoCtrlChannel)
	}
	ev := &chanEvents{e: e, p: p}
	ch, err := ctrlchannel.NewChannel(e.loop, e.dev, e.pd, e.channelConfig(), ev)
	if err != nil {
		return nil, fmt.Errorf("notify: new ctrl channel to %s: %w", p.name, err)
	}
	ev.ch = ch
	return ch, nil
}

// handshakeDesc is our side of the Connection RPC, in Mooncake's field names plus ts_*.
func (e *Engine) handshakeDesc(ch *ctrlchannel.Channel, peerName string, epoch uint64) *oob.HandshakeDesc {
	l := ch.Local()
	return &oob.HandshakeDesc{
		LocalNICPath:  e.name + "@" + e.devName,
		PeerNICPath:   ctrlNICPath,
		LocalLID:      l.LID,
		LocalGID:      l.GID.String(),
		CtrlChannel:   true,
		NotifyQPNum:   l.QPN,
		NotifyRQDepth: l.RQDepth,
		MTU:           uint32(l.MTU.Bytes()),
		PSN:           l.PSN,
		Session:       e.session,
		Epoch:         epoch,
		BufSize:       l.BufSize,
		Extensions:    l.Extensions,
		PeerName:      e.name,
	}
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
		PSN: d.PSN, BufSize: d.BufSize, Extensions: d.Extensions,
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

func (h *oobHandler) HandleNotify(req *oob.NotifyRequest, reply func(error)) {
	e := (*Engine)(h)
	if e.closing || !e.started {
		reply(ErrClosed)
		return
	}
	// Counted against a known peer only: a notify must not make the engine remember names.
	p := e.peers[req.From]
	e.deliver(p, req.Session, req.Seq, Notify{Peer: req.From, Name: req.Name, Msg: req.Msg}, reply)
}

func (h *oobHandler) HandleHandshake(req *oob.HandshakeDesc, reply func(*oob.HandshakeDesc, error)) {
	e := (*Engine)(h)
	if e.closing || !e.started {
		reply(nil, ErrClosed)
		return
	}
	if e.dev == nil {
		reply(nil, fmt.Errorf("%w: this engine runs transport %q", ErrNoCtrlChannel, e.cfg.transport))
		return
	}
	peerInfo, err := peerInfoFrom(req)
	if err != nil {
		reply(nil, err)
		return
	}
	name := peerNameOf(req)
	if name == "" {
		reply(nil, fmt.Errorf("%w: local_nic_path: empty, no peer name", ErrInvalid))
		return
	}
	p := e.peer(name)
	if e.name < name {
		// Simultaneous open: the engine with the smaller name is the active side. Refuse the
		// peer's attempt while ours is in flight, and a straggler of it that arrives once
		// ours is up: same session, no newer epoch than the channel both ends now use. A
		// reconnect carries a newer epoch, a restarted peer a new session.
		straggler := p.state == stateUp && req.Session == p.remoteSession && req.Epoch != 0 && req.Epoch <= p.epoch
		if p.state == stateConnecting || straggler {
			reply(nil, fmt.Errorf("%s", yieldMsg))
			return
		}
	}
	if p.ch == nil && e.channels() >= e.cfg.maxChannels {
		reply(nil, e.channelLimitErr())
		return
	}
	ch, err := e.newChannel(p)
	if err != nil {
		reply(nil, err)
		return
	}
	epoch := req.Epoch
	if epoch == 0 {
		epoch = p.epoch + 1
	}
	if err := ch.Connect(peerInfo, e.session, req.Session, epoch); err != nil {
		ch.Close(ctrlchannel.ErrClosed)
		reply(nil, err)
		return
	}
	if p.ch != nil {
		// The peer restarted or reconnected: the old channel's pending sends fail (and fall
		// back to OOB when enabled); its late frames die with its QP.
		p.ch.Close(fmt.Errorf("%w: replaced by a new channel from %s", ctrlchannel.ErrClosed, name))
	}
	if p.pending != nil {
		// Our own attempt loses; finishConnect sees it superseded.
		p.pending = nil
	}
	if p.yieldTimer != nil {
		p.yieldTimer.Stop()
		p.yieldTimer = nil
	}
	e.adopt(p, ch, epoch, req.Session, req.NotifyQPNum)
	reply(e.handshakeDesc(ch, name, epoch), nil)
}
