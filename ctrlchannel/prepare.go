package ctrlchannel

import (
	"fmt"

	"github.com/rs/zerolog"

	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/reactor"
)

// rcQP is a channel's verbs side: the port and source GID it uses, the QP and its CQ on a
// completion channel, and the registered rings. Its methods are the verbs calls that may
// block on a NIC (create_qp, modify_qp, reg_mr): they run on any goroutine, one at a time.
type rcQP struct {
	pd      ibv.PD
	port    ibv.PortAttr
	gid     ibv.GIDEntry // the source GID: advertised, and the address vector's sgid_index
	psn     uint32       // our initial send PSN (24 bits, random), advertised as ts_psn
	qpn     uint32
	mtu     ibv.MTU
	pathMTU ibv.MTU
	inline  int

	cc      ibv.CompChannel
	cq      ibv.CQ
	qp      ibv.QP
	sendBuf []byte // allocated and registered once the peer answered (allocRings)
	recvBuf []byte
	sendMR  ibv.MR
	recvMR  ibv.MR
}

// create makes the completion channel, the CQ and the QP, and moves the QP to INIT.
func (r *rcQP) create(dev ibv.Context, pd ibv.PD, cfg *Config) error {
	port, err := dev.QueryPort(cfg.PortNum)
	if err != nil {
		return fmt.Errorf("ctrlchannel: query port %d: %w", cfg.PortNum, err)
	}
	if port.State != ibv.PortActive {
		return fmt.Errorf("ctrlchannel: port %d is %s: %w", cfg.PortNum, port.State, ibv.ErrNoDevice)
	}
	r.port, r.pd = port, pd
	if r.gid, err = ibv.SelectGID(port, cfg.GIDIndex); err != nil {
		return fmt.Errorf("ctrlchannel: %w", err)
	}
	r.mtu = port.ActiveMTU
	if cfg.MTU != 0 {
		r.mtu = ibv.MinMTU(r.mtu, cfg.MTU)
	}
	slots := cfg.MaxPendingSends
	if r.cc, err = dev.CreateCompChannel(); err != nil {
		return fmt.Errorf("ctrlchannel: create comp channel: %w", err)
	}
	if r.cq, err = dev.CreateCQ(slots+cfg.RecvCount, r.cc); err != nil {
		return fmt.Errorf("ctrlchannel: create cq: %w", err)
	}
	r.qp, err = pd.CreateQP(ibv.QPInitAttr{SendCQ: r.cq, RecvCQ: r.cq, Type: ibv.QPTypeRC,
		Cap: ibv.QPCap{MaxSendWR: uint32(slots), MaxRecvWR: uint32(cfg.RecvCount), MaxSendSGE: 1, MaxRecvSGE: 1,
			MaxInlineData: uint32(cfg.MaxInline)}})
	if err != nil {
		return fmt.Errorf("ctrlchannel: create qp: %w", err)
	}
	r.qpn = r.qp.QPNum()
	// The caps create_qp granted, not ibv_query_qp: some drivers refuse a query in RESET.
	r.inline = min(cfg.MaxInline, int(r.qp.Cap().MaxInlineData))
	if r.psn, err = randomPSN(); err != nil {
		return fmt.Errorf("ctrlchannel: initial psn: %w", err)
	}
	if err := r.qp.Modify(&ibv.QPAttr{QPState: ibv.QPSInit, PortNum: cfg.PortNum, PKeyIndex: cfg.PKeyIndex, QPAccessFlags: ibv.AccessLocalWrite},
		ibv.AttrState|ibv.AttrPKeyIndex|ibv.AttrPort|ibv.AttrAccessFlags); err != nil {
		return fmt.Errorf("ctrlchannel: qp %d to INIT: %w", r.qpn, err)
	}
	return nil
}

// allocRings allocates and registers the send and receive rings. They wait for the peer's
// answer: a channel whose peer never answers holds only its QP and CQ (the rings are
// ~0.5 MiB at the defaults).
func (r *rcQP) allocRings(cfg *Config) error {
	var err error
	r.sendBuf = make([]byte, cfg.MaxPendingSends*cfg.BufSize)
	r.recvBuf = make([]byte, cfg.RecvCount*cfg.BufSize)
	if r.sendMR, err = r.pd.RegMR(r.sendBuf, ibv.AccessLocalWrite); err != nil {
		return fmt.Errorf("ctrlchannel: register send ring: %w", err)
	}
	if r.recvMR, err = r.pd.RegMR(r.recvBuf, ibv.AccessLocalWrite); err != nil {
		return fmt.Errorf("ctrlchannel: register receive ring: %w", err)
	}
	return nil
}

// postRecvs posts a RECV on every slot of the receive ring, in one chain. The QP may be in
// INIT: RECVs posted before RTR are there when the peer's first frame comes.
func (r *rcQP) postRecvs(cfg *Config) error {
	n := cfg.RecvCount
	wrs := make([]ibv.RecvWR, n)
	sges := make([]ibv.SGE, n)
	for i := range wrs {
		sges[i] = ibv.SGE{Addr: r.recvMR.Addr() + uint64(i*cfg.BufSize), Length: uint32(cfg.BufSize), LKey: r.recvMR.LKey()}
		wrs[i] = ibv.RecvWR{WRID: recvWRIDBit | uint64(i), SGList: sges[i : i+1 : i+1]}
		if i > 0 {
			wrs[i-1].Next = &wrs[i]
		}
	}
	if _, err := r.qp.PostRecv(&wrs[0]); err != nil {
		return fmt.Errorf("%w: post recv: %w", ErrPeerError, err)
	}
	return nil
}

// connect moves the QP to RTR and RTS towards peer. RTR is the call that blocks on RoCE
// while the kernel resolves the peer's MAC.
func (r *rcQP) connect(cfg *Config, peer PeerInfo) error {
	r.pathMTU = r.mtu
	if peer.MTU != 0 {
		r.pathMTU = ibv.MinMTU(r.mtu, peer.MTU) // Mooncake never negotiates it (its issue #3868)
	}
	ah := ibv.AHAttr{DLID: peer.LID, PortNum: cfg.PortNum, SL: cfg.SL}
	if !peer.GID.IsZero() {
		ah.IsGlobal, ah.DGID, ah.SGIDIndex, ah.HopLimit = true, peer.GID, uint8(r.gid.Index), 16
		ah.TrafficClass = cfg.TrafficClass
	}
	if err := r.qp.Modify(&ibv.QPAttr{QPState: ibv.QPSRTR, PathMTU: r.pathMTU, AHAttr: ah, DestQPNum: peer.QPN,
		RqPSN: peer.PSN, MaxDestRdAtomic: 1, MinRNRTimer: cfg.MinRNRTimer},
		ibv.AttrState|ibv.AttrAV|ibv.AttrPathMTU|ibv.AttrDestQPN|ibv.AttrRqPSN|ibv.AttrMaxDestRdAtomic|ibv.AttrMinRNRTimer); err != nil {
		return fmt.Errorf("ctrlchannel: qp %d to RTR: %w", r.qpn, err)
	}
	// Our send PSN is the one Local advertised; a Mooncake peer reads no ts_psn and expects 0.
	sqPSN := r.psn
	if peer.Legacy {
		sqPSN = 0
	}
	if err := r.qp.Modify(&ibv.QPAttr{QPState: ibv.QPSRTS, SqPSN: sqPSN, Timeout: cfg.Timeout, RetryCnt: cfg.RetryCnt,
		RnrRetry: cfg.RnrRetry, MaxRdAtomic: 1},
		ibv.AttrState|ibv.AttrSqPSN|ibv.AttrTimeout|ibv.AttrRetryCnt|ibv.AttrRnrRetry|ibv.AttrMaxQPRdAtomic); err != nil {
		return fmt.Errorf("ctrlchannel: qp %d to RTS: %w", r.qpn, err)
	}
	return nil
}

// destroy destroys whatever create and allocRings made, in reverse order; what is gone is
// nil after it, so a second call does nothing.
func (r *rcQP) destroy(log zerolog.Logger) {
	logErr := func(what string, err error) {
		if err != nil {
			log.Warn().Err(err).Str("what", what).Msg("ctrlchannel: teardown")
		}
	}
	if r.qp != nil {
		logErr("qp", r.qp.Destroy())
		r.qp = nil
	}
	if r.cq != nil {
		logErr("cq", r.cq.Destroy())
		r.cq = nil
	}
	if r.cc != nil {
		logErr("comp channel", r.cc.Close())
		r.cc = nil
	}
	if r.sendMR != nil {
		logErr("send mr", r.sendMR.Dereg())
		r.sendMR = nil
	}
	if r.recvMR != nil {
		logErr("recv mr", r.recvMR.Dereg())
		r.recvMR = nil
	}
	r.sendBuf, r.recvBuf = nil, nil
}

func (r *rcQP) local(cfg *Config) LocalInfo {
	return LocalInfo{QPN: r.qpn, GID: r.gid.GID, LID: r.port.LID, MTU: r.mtu, RQDepth: uint16(cfg.RecvCount),
		PSN: r.psn, BufSize: uint32(cfg.BufSize), Extensions: cfg.Extensions}
}

// checkPeer validates what the peer's handshake said before a verb uses it.
func checkPeer(peer PeerInfo) error {
	switch {
	case peer.QPN == 0 || peer.QPN > 1<<24-1:
		return fmt.Errorf("%w: PeerInfo.QPN %d: want 1..2^24-1", ErrConfig, peer.QPN)
	case peer.RQDepth == 0:
		return fmt.Errorf("%w: PeerInfo.RQDepth 0: want 1..65535", ErrConfig)
	case peer.MTU != 0 && !peer.MTU.Valid():
		return fmt.Errorf("%w: PeerInfo.MTU %d: not an IB MTU", ErrConfig, peer.MTU)
	case peer.GID.IsZero() && peer.LID == 0:
		return fmt.Errorf("%w: PeerInfo: neither GID nor LID set", ErrConfig)
	}
	return nil
}

func peerParams(peer PeerInfo, localSession, peerSession, epoch, delivered uint64) PeerParams {
	return PeerParams{LocalSession: localSession, PeerSession: peerSession, Epoch: epoch,
		RQDepth: int(peer.RQDepth), BufSize: int(peer.BufSize), Extensions: peer.Extensions, DeliveredSeq: delivered,
		Legacy: peer.Legacy, MaxNotifySize: int(peer.MaxNotifySize)}
}

type prepState uint8

const (
	prepNew   prepState = iota // QP in INIT: Local is known, Ready may run
	prepReady                  // QP in RTS, RECVs posted: Adopt may take it
	prepSpent                  // adopted or released
)

// Prepared is a channel made off the loop, before it joins one: Prepare creates the QP (in
// INIT) and its CQ, Ready registers the rings, posts every RECV and moves the QP to RTR
// and RTS, and Adopt hands it to a loop as a running Channel. Prepare and Ready may run on
// any goroutine (they are the verbs that can block on a NIC: ibv_create_qp, ibv_reg_mr, and
// modify to RTR, which on RoCE waits for the kernel to resolve the peer's MAC), so a slow
// one stalls no other channel of the loop. A Prepared is used by one goroutine at a time;
// handing it over through reactor.Loop.Submit orders its uses. One that is not adopted
// must be released (Release): it holds a QP, a CQ, a completion channel and, after Ready,
// two registered rings.
type Prepared struct {
	cfg Config
	rcQP
	m     *Machine
	peer  PeerInfo
	state prepState
}

// Prepare creates a channel's QP in INIT and its CQ on a completion channel of dev, with
// cfg (Defaults of pd applied, then the documented defaults). Any goroutine. On error
// nothing is left to release.
func Prepare(dev ibv.Context, pd ibv.PD, cfg Config) (*Prepared, error) {
	if dev == nil || pd == nil {
		return nil, fmt.Errorf("%w: prepare: dev and pd must not be nil", ErrConfig)
	}
	if d, ok := pd.(Defaults); ok {
		d.ChannelDefaults(&cfg)
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if cfg.Extensions && cfg.RecvCount < minCreditRQ {
		return nil, fmt.Errorf("%w: Config.RecvCount %d: credit flow control needs at least %d", ErrConfig, cfg.RecvCount, minCreditRQ)
	}
	p := &Prepared{cfg: cfg}
	if err := p.create(dev, pd, &p.cfg); err != nil {
		p.Release()
		return nil, err
	}
	m, err := NewMachine(Params{RecvCount: cfg.RecvCount, BufSize: cfg.BufSize, SendSlots: cfg.MaxPendingSends,
		MaxPendingSends: cfg.MaxPendingSends, MaxNotifySize: cfg.MaxNotifySize, Extensions: cfg.Extensions,
		DisableCredits: cfg.DisableCredits})
	if err != nil {
		p.Release()
		return nil, err
	}
	p.m = m
	return p, nil
}

// Local is this side's handshake information.
func (p *Prepared) Local() LocalInfo { return p.local(&p.cfg) }

// Ready registers the rings, posts every RECV and moves the QP to RTR and RTS towards peer.
// Any goroutine; once. After an error, Release p.
func (p *Prepared) Ready(peer PeerInfo) error {
	if p.state != prepNew {
		return fmt.Errorf("%w: ready: the channel is not new", ErrConfig)
	}
	if err := checkPeer(peer); err != nil {
		return err
	}
	if err := p.allocRings(&p.cfg); err != nil {
		return err
	}
	if err := p.m.SetSendRing(p.sendBuf); err != nil {
		return err
	}
	// The machine's first actions post every RECV: done here, before RTR, in one chain.
	for _, a := range p.m.Ready() {
		if a.Kind != ActPostRecv {
			return fmt.Errorf("%w: ready: a new machine asked for %s", ErrConfig, a.Kind)
		}
	}
	if err := p.postRecvs(&p.cfg); err != nil {
		return err
	}
	if err := p.connect(&p.cfg, peer); err != nil {
		return err
	}
	p.peer, p.state = peer, prepReady
	return nil
}

// Release destroys what p holds (QP, CQ, completion channel, MRs) unless Adopt took it.
// Any goroutine; a second call does nothing.
func (p *Prepared) Release() {
	if p == nil || p.state == prepSpent {
		return
	}
	p.state = prepSpent
	p.destroy(p.cfg.Logger)
	p.m = nil
}

// Adopt makes a ready p a running Channel on loop: the CQ's completion channel joins the
// loop's epoll set and the machine starts with the sessions and epoch the engine assigned.
// Events go to ev. Loop-only. p is spent either way: on error its resources are released.
func Adopt(loop *reactor.Loop, p *Prepared, ev Events, localSession, peerSession, epoch uint64) (*Channel, error) {
	switch {
	case p == nil:
		return nil, fmt.Errorf("%w: adopt: p must not be nil", ErrConfig)
	case loop == nil || !loop.InLoop():
		p.Release()
		return nil, fmt.Errorf("ctrlchannel: adopt: %w", reactor.ErrNotInLoop)
	case ev == nil:
		p.Release()
		return nil, fmt.Errorf("%w: adopt: ev must not be nil", ErrConfig)
	case p.state != prepReady:
		p.Release()
		return nil, fmt.Errorf("%w: adopt: the channel is not ready", ErrConfig)
	}
	peer := p.peer
	c := newChannel(loop, p, ev)
	if err := c.m.Connected(loop.Now(), peerParams(peer, localSession, peerSession, epoch, 0)); err != nil {
		c.release()
		return nil, err
	}
	c.connected = true
	var err error
	if c.watch, err = loop.WatchCQ(c.cq, c); err != nil {
		c.release()
		return nil, fmt.Errorf("ctrlchannel: watch cq: %w", err)
	}
	// WatchCQ's first cycle reaps what completed before the watch (frames the peer sent
	// between our RTR and now).
	c.starting = true
	c.run()
	c.starting = false
	if c.closed {
		return nil, c.closeErr
	}
	return c, nil
}
