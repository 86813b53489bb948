package ctrlchannel

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/internal/tracepoint"
	"github.com/twosided/twosided/reactor"
	"github.com/twosided/twosided/reactor/limits"
)

// Config configures a Channel. Zero fields take the defaults in brackets.
type Config struct {
	RecvCount       int    // receive ring depth = advertised notify_rq_depth [64]; 1..4096 (3.. with Extensions)
	BufSize         int    // bytes per RECV buffer = largest frame [4096]; 256..65536
	MaxPendingSends int    // queued+in-flight sends before Send fails with ErrBackpressure [64]; 1..4096; also the send ring depth
	MaxNotifySize   int    // largest name+msg after reassembly [1 MiB]
	MaxInline       int    // max_inline_data asked of the QP [64]; negative: none; frames up to what the QP grants are posted inline
	PortNum         uint8  // [1]
	PKeyIndex       uint16 // the QP's P_Key index (INIT)
	TrafficClass    uint8  // the address vector's GRH traffic class (RTR)
	SL              uint8  // the address vector's service level (RTR)
	// GIDIndex is the port's GID table entry the channel sources its traffic from: both the
	// GID it advertises (Local) and the sgid_index of its address vector. GIDAuto lets
	// ibv.SelectGID choose; an index that is empty or of a type the port cannot use fails
	// NewChannel with an error wrapping ibv.ErrGIDIndex.
	GIDIndex int
	MTU      ibv.MTU // local cap [port active MTU]
	// QP attributes [12, 14, 7, 7] (Mooncake's). A zero value takes the default.
	MinRNRTimer, Timeout, RetryCnt, RnrRetry uint8
	Extensions                               bool          // we support twosided extension frames (fragmentation, credit grants)
	DisableCredits                           bool          // test-only: no credit flow control
	ByeTimeout                               time.Duration // Bye: the longest wait for SESSION_CLOSE's completion [1s]
	Logger                                   zerolog.Logger
}

func (c *Config) setDefaults() error {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.RecvCount, int(limits.RecvCount.Default))
	def(&c.BufSize, int(limits.BufferSize.Default))
	def(&c.MaxPendingSends, int(limits.MaxPendingSends.Default))
	def(&c.MaxNotifySize, int(limits.MaxNotifySize.Default))
	def(&c.MaxInline, 64)
	if c.MaxInline < 0 {
		c.MaxInline = 0
	}
	if c.PortNum == 0 {
		c.PortNum = 1
	}
	if c.ByeTimeout == 0 {
		c.ByeTimeout = time.Second
	}
	for _, f := range []struct {
		v *uint8
		d uint8
	}{{&c.MinRNRTimer, 12}, {&c.Timeout, 14}, {&c.RetryCnt, 7}, {&c.RnrRetry, 7}} {
		if *f.v == 0 {
			*f.v = f.d
		}
	}
	bad := func(field string, v any, why string) error {
		return fmt.Errorf("%w: Config.%s %v: %s", ErrConfig, field, v, why)
	}
	// The ranges shared with notify's options and environment come from one table.
	for _, f := range []struct {
		l     *limits.Limit
		field string
		v     int
	}{
		{&limits.RecvCount, "Config.RecvCount", c.RecvCount},
		{&limits.BufferSize, "Config.BufSize", c.BufSize},
		{&limits.MaxPendingSends, "Config.MaxPendingSends", c.MaxPendingSends},
		{&limits.MaxNotifySize, "Config.MaxNotifySize", c.MaxNotifySize},
	} {
		if err := f.l.Check(f.field, int64(f.v)); err != nil {
			return fmt.Errorf("%w: %w", ErrConfig, err)
		}
	}
	switch {
	case c.MTU != 0 && !c.MTU.Valid():
		return bad("MTU", c.MTU, "not an IB MTU")
	case c.MinRNRTimer > 31:
		return bad("MinRNRTimer", c.MinRNRTimer, "want 0..31")
	case c.Timeout > 31:
		return bad("Timeout", c.Timeout, "want 0..31")
	case c.RetryCnt > 7:
		return bad("RetryCnt", c.RetryCnt, "want 0..7")
	case c.RnrRetry > 7:
		return bad("RnrRetry", c.RnrRetry, "want 0..7")
	case c.SL > 15:
		return bad("SL", c.SL, "want 0..15")
	case c.GIDIndex < GIDAuto || c.GIDIndex > 255:
		return bad("GIDIndex", c.GIDIndex, "want 0..255 or GIDAuto (-1)")
	case c.ByeTimeout < 0:
		return bad("ByeTimeout", c.ByeTimeout, "must not be negative")
	}
	return nil
}

// LocalInfo is what this side puts into the handshake.
type LocalInfo struct {
	QPN        uint32
	GID        ibv.GID
	LID        uint16
	MTU        ibv.MTU
	RQDepth    uint16
	PSN        uint32
	BufSize    uint32
	Extensions bool
}

// PeerInfo is what the peer's handshake said. MTU 0 means unknown (ours is used), BufSize
// 0 means the same as ours.
type PeerInfo struct {
	QPN        uint32
	GID        ibv.GID
	LID        uint16
	MTU        ibv.MTU
	RQDepth    uint16
	PSN        uint32
	BufSize    uint32
	Extensions bool
	// MaxNotifySize is the largest name+msg the peer delivers (ts_max_notify; 0: not said).
	MaxNotifySize uint32
	// Legacy: the peer is a Mooncake PR #3440 ctrl channel (its handshake carried no
	// ts_session). Its frames are accepted with epoch 0 and seqs restarting at 1 on each
	// channel; it gets no credit frames, fragments, NOTIFY_ID or FENCE (see the package doc).
	Legacy bool
}

// Delivery is one received notify. Msg is owned by the receiver of the callback. ID is
// the sender's notify id (SendReq.ID; empty from a Mooncake peer).
type Delivery struct {
	Session, Epoch, Seq uint64
	Name                string
	Msg                 []byte
	ID                  string
}

// Events receives a channel's deliveries and its end.
type Events interface {
	// OnNotify is called on the loop, in order.
	OnNotify(d Delivery)
	// OnFence is called on the loop, in order with OnNotify: the peer's session gave up
	// on its seqs first..first+count-1 of this pair and will never send them.
	OnFence(session, first, count uint64)
	// OnClosed is called on the loop, once; every pending Send has had Done called before.
	OnClosed(err error)
}

// ChannelStats are a channel's counters.
type ChannelStats struct {
	MachineStats
	WCErrors         uint64 // completions with an error status
	RNRRetryExceeded uint64 // of which IBV_WC_RNR_RETRY_EXC_ERR
	PostErrors       uint64 // PostSend/PostRecv failures
	SendSlots        int
	PathMTU          ibv.MTU
}

// Defaults is what a PD handed to NewChannel may implement to fill in the Config fields
// its caller left zero (notify's engine sets the QP attributes of its configuration so).
type Defaults interface {
	ChannelDefaults(cfg *Config)
}

// GIDAuto as Config.GIDIndex lets ibv.SelectGID pick the source GID.
const GIDAuto = -1

const recvWRIDBit = uint64(1) << 63 // RECV WRIDs carry the slot; SEND WRIDs the frame number

// Channel is one peer's control channel: an RC QP, its CQ on a completion channel watched
// by the reactor, a registered send ring and receive ring, and the Machine. Every method is
// loop-only.
type Channel struct {
	loop *reactor.Loop
	cfg  Config
	ev   Events
	log  zerolog.Logger

	rcQP // the verbs side (prepare.go)

	watch *reactor.CQWatch
	timer *reactor.Timer

	m         *Machine
	running   bool
	starting  bool // NewChannel, Adopt: a failure is their error, not OnClosed
	connected bool
	closed    bool
	tornDown  bool
	// draining: the QP went to ERR (Drain, ActDrain): flushed completions are ignored and
	// nothing is posted. drainErr: the close that follows ActDrain.
	draining  bool
	drainErr  error
	closeErr  error
	delivered uint64

	swr   []ibv.SendWR
	ssge  []ibv.SGE
	nswr  int
	rwr   []ibv.RecvWR
	rsge  []ibv.SGE
	nrwr  int
	names map[string]string
	slab  reactor.Slab   // copies of delivered messages
	drops zerolog.Logger // dropped frames, rate-limited

	wcErrors, rnrExceeded, postErrors uint64
}

// NewChannel creates the QP (in INIT) and its CQ, and starts watching the CQ on loop; its
// rings and RECVs wait for Connect. Loop-only. It runs the verbs on the loop: an engine
// with many peers uses Prepare, Ready and Adopt instead, so that a slow verb (a RoCE RTR
// resolving the peer's MAC) stalls no other channel.
func NewChannel(loop *reactor.Loop, dev ibv.Context, pd ibv.PD, cfg Config, ev Events) (*Channel, error) {
	if loop == nil || !loop.InLoop() {
		return nil, fmt.Errorf("ctrlchannel: new channel: %w", reactor.ErrNotInLoop)
	}
	if dev == nil || pd == nil || ev == nil {
		return nil, fmt.Errorf("%w: new channel: dev, pd and ev must not be nil", ErrConfig)
	}
	p, err := Prepare(dev, pd, cfg)
	if err != nil {
		return nil, err
	}
	c := newChannel(loop, p, ev)
	if c.watch, err = c.loop.WatchCQ(c.cq, c); err != nil {
		c.release()
		return nil, fmt.Errorf("ctrlchannel: watch cq: %w", err)
	}
	c.starting = true
	c.run() // the machine's first RECV posts wait for the rings (Connect)
	c.starting = false
	if c.closed {
		return nil, c.closeErr
	}
	return c, nil
}

// newChannel makes the driver around p's verbs side and machine, which it takes over (p is
// spent).
func newChannel(loop *reactor.Loop, p *Prepared, ev Events) *Channel {
	cfg := p.cfg
	c := &Channel{loop: loop, cfg: cfg, ev: ev, log: cfg.Logger, names: make(map[string]string), rcQP: p.rcQP, m: p.m}
	p.rcQP, p.m, p.state = rcQP{}, nil, prepSpent
	// A peer that sends garbage must not flood the log: 10 lines a second, then 1 in 1000.
	c.drops = cfg.Logger.Sample(&zerolog.BurstSampler{Burst: 10, Period: time.Second, NextSampler: &zerolog.BasicSampler{N: 1000}})
	slots := cfg.MaxPendingSends
	c.swr = make([]ibv.SendWR, slots)
	c.ssge = make([]ibv.SGE, slots)
	c.rwr = make([]ibv.RecvWR, cfg.RecvCount)
	c.rsge = make([]ibv.SGE, cfg.RecvCount)
	for i := range c.swr {
		c.swr[i].SGList = c.ssge[i : i+1 : i+1]
		c.swr[i].Opcode = ibv.WRSend
	}
	for i := range c.rwr {
		c.rwr[i].SGList = c.rsge[i : i+1 : i+1]
	}
	return c
}

// release destroys what the channel holds, in reverse order of making.
func (c *Channel) release() {
	if c.timer != nil {
		c.timer.Stop()
	}
	if c.watch != nil {
		if err := c.watch.Close(); err != nil {
			c.log.Warn().Err(err).Str("what", "cq watch").Msg("ctrlchannel: teardown")
		}
		c.watch = nil
	}
	c.rcQP.destroy(c.log)
}

// Local is this side's handshake information.
func (c *Channel) Local() LocalInfo { return c.local(&c.cfg) }

// SetDeliveredSeq tells the channel the highest seq of the peer's session the engine has
// already delivered (over OOB or an earlier connection). Call it before Connect. Loop-only.
func (c *Channel) SetDeliveredSeq(seq uint64) { c.delivered = seq }

// Connect moves the QP to RTR and RTS towards peer and starts the protocol. Loop-only.
func (c *Channel) Connect(peer PeerInfo, localSession, peerSession, epoch uint64) error {
	if err := c.loopOnly("connect"); err != nil {
		return err
	}
	if c.closed {
		return fmt.Errorf("ctrlchannel: connect: %w", ErrClosed)
	}
	if c.connected {
		return fmt.Errorf("%w: connect: already connected", ErrConfig)
	}
	if err := checkPeer(peer); err != nil {
		return err
	}
	if c.recvMR == nil {
		if err := c.allocRings(&c.cfg); err != nil {
			return err
		}
		if err := c.m.SetSendRing(c.sendBuf); err != nil {
			return err
		}
		// The machine's first RECV posts were dropped before the rings existed: every
		// slot is posted here (the QP is in INIT, so none is missing at the first frame).
		if err := c.postRecvs(&c.cfg); err != nil {
			c.postErrors++
			return err
		}
	}
	if err := c.rcQP.connect(&c.cfg, peer); err != nil {
		return err
	}
	if err := c.m.Connected(c.loop.Now(), peerParams(peer, localSession, peerSession, epoch, c.delivered)); err != nil {
		return err
	}
	c.connected = true
	c.run()
	return nil
}

// Send queues r. r.Done is called on the loop exactly once: nil only after the SEND of
// every frame of the notify completed successfully. Loop-only.
func (c *Channel) Send(r *SendReq) {
	if !c.loop.OnLoop() {
		panic(reactor.ErrNotInLoop)
	}
	c.m.Submit(c.loop.Now(), r)
	c.run()
}

// SetPaused holds (true) or releases (false) received notifies: while paused, RECVs are
// reaped but their notifies and buffers are kept, so no credit goes back and the peer's
// sends wait. Loop-only.
func (c *Channel) SetPaused(p bool) {
	if !c.loop.OnLoop() {
		panic(reactor.ErrNotInLoop)
	}
	c.m.SetPaused(c.loop.Now(), p)
	c.run()
}

// Keepalive detects a dead peer on an idle channel; the engine calls it periodically.
// When nothing arrived from the peer since the previous call and no SEND is in flight,
// it posts one small signaled CTRL_ACK frame (Machine.Keepalive) that the peer consumes
// without delivering anything. If the peer is gone, that SEND fails with RETRY_EXC_ERR
// after the QP's timeout×retry_cnt and the channel closes: OnClosed gets an error
// wrapping ErrPeerError. A dead peer is so noticed within two periods plus that retry
// time, unless the channel is down to its credit reserve (see the package doc). Loop-only.
func (c *Channel) Keepalive() {
	if !c.loop.OnLoop() {
		panic(reactor.ErrNotInLoop)
	}
	c.m.Keepalive()
	c.run()
}

// Fence tells the peer, in order with the notifies sent before, that this side gave up on
// its seqs first..first+count-1 of this pair and will never send them; the peer's OnFence
// reports it. Towards a legacy (Mooncake) peer it does nothing. See Machine.Fence for its
// errors. Loop-only.
func (c *Channel) Fence(first, count uint64) error {
	if err := c.loopOnly("fence"); err != nil {
		return err
	}
	err := c.m.Fence(first, count)
	c.run()
	return err
}

// Bye closes gracefully: the sends queued before it still go out, then a SESSION_CLOSE
// frame, and the channel closes (OnClosed with ErrClosed) once that frame completed, or
// after Config.ByeTimeout. The peer delivers everything before it and closes with
// ErrPeerClosed. Loop-only.
func (c *Channel) Bye() {
	if !c.loop.OnLoop() {
		panic(reactor.ErrNotInLoop)
	}
	now := c.loop.Now()
	c.m.Bye(now, now.Add(c.cfg.ByeTimeout))
	c.run()
}

// Close fails pending sends with err (wrapping ErrClosed), destroys QP, CQ and MRs and
// calls OnClosed. Loop-only.
func (c *Channel) Close(err error) {
	if !c.loop.OnLoop() {
		panic(reactor.ErrNotInLoop)
	}
	c.m.Close(err)
	c.run()
}

// Drain prepares a graceful close: the QP goes to ERR, so the NIC acknowledges no further
// SEND, then the CQ is reaped, so every notify whose SEND the peer saw complete is handed
// to OnNotify rather than dropped with the ring. Call Close after it. Loop-only.
func (c *Channel) Drain() {
	if !c.loop.OnLoop() {
		panic(reactor.ErrNotInLoop)
	}
	if c.tornDown || c.qp == nil {
		return
	}
	c.toErr()
	if c.watch != nil {
		c.watch.Kick()
	}
}

// toErr moves the QP to ERR for a drain: the NIC acknowledges no further SEND, what is
// posted is flushed (those completions are ignored), and nothing more is posted.
func (c *Channel) toErr() {
	if c.draining {
		return
	}
	c.draining = true
	if err := c.qp.Modify(&ibv.QPAttr{QPState: ibv.QPSErr}, ibv.AttrState); err != nil {
		c.cfg.Logger.Debug().Err(err).Uint32("qp", c.qpn).Msg("drain: qp to ERR")
	}
}

// drainClose ends a goodbye (ActDrain): the QP went to ERR, the CQ is reaped now (outside
// any completion cycle: it runs from the loop's queue), so every notify whose SEND the
// peer saw complete is delivered, then the channel closes.
func (c *Channel) drainClose() {
	if c.tornDown || c.closed {
		return
	}
	if c.watch != nil {
		c.watch.Kick()
	}
	c.m.Close(c.drainErr)
	c.run()
}

// QPAttr is the channel's QP as the device reports it (ibv_query_qp) and the inline size
// its sends use: for diagnostics and tests. Loop-only.
func (c *Channel) QPAttr() (attr ibv.QPAttr, caps ibv.QPCap, inline int, err error) {
	if err := c.loopOnly("qp attr"); err != nil {
		return attr, caps, 0, err
	}
	if c.qp == nil {
		return attr, caps, 0, fmt.Errorf("ctrlchannel: qp attr: %w", ErrClosed)
	}
	attr, caps, err = c.qp.Query()
	return attr, caps, c.inline, err
}

// MaxNotify is the largest name+msg a notify sent on the channel may have once it is
// connected (Machine.MaxNotify): a larger one fails with ErrTooLarge. Loop-only.
func (c *Channel) MaxNotify() int { return c.m.MaxNotify() }

// Stats returns the counters. Loop-only.
func (c *Channel) Stats() ChannelStats {
	return ChannelStats{MachineStats: c.m.Stats(), WCErrors: c.wcErrors, RNRRetryExceeded: c.rnrExceeded,
		PostErrors: c.postErrors, SendSlots: c.cfg.MaxPendingSends, PathMTU: c.pathMTU}
}

func (c *Channel) loopOnly(op string) error {
	if !c.loop.OnLoop() {
		return fmt.Errorf("ctrlchannel: %s: %w", op, reactor.ErrNotInLoop)
	}
	return nil
}

// HandleWC is step 1 of the completion rule (reactor.CQHandler).
func (c *Channel) HandleWC(wcs []ibv.WC) {
	tracepoint.Mark(tracepoint.CQPoll, len(wcs))
	if c.tornDown {
		return
	}
	now := c.loop.Now()
	for i := range wcs {
		wc := &wcs[i]
		if wc.Status != ibv.WCSuccess {
			if wc.Status == ibv.WCWRFlushErr && (c.m.Closed() || c.draining) {
				continue
			}
			c.wcErrors++
			if wc.Status == ibv.WCRNRRetryExcErr {
				c.rnrExceeded++
			}
			err := wc.Err()
			if wc.Status == ibv.WCLocLenErr && wc.WRID&recvWRIDBit != 0 {
				// The peer sent a frame longer than our RECV buffer. A peer that does not
				// announce its buffer (Mooncake) uses its own MC_RDMA_NOTIFY_BUFFER_SIZE,
				// as two Mooncake engines do: the sizes must agree, or the QP dies.
				err = fmt.Errorf("%w: a frame longer than this side's %d-byte RECV buffer: the peer's buffer size is larger; set the same MC_RDMA_NOTIFY_BUFFER_SIZE (buffer_size) on both sides", err, c.cfg.BufSize)
				c.cfg.Logger.Warn().Err(err).Uint32("qp", c.qpn).Msg("ctrlchannel: receive buffer too small for the peer's frame")
			}
			c.m.FailWC(err)
			continue
		}
		if wc.WRID&recvWRIDBit != 0 {
			slot := int(wc.WRID &^ recvWRIDBit)
			off := slot * c.cfg.BufSize
			n := min(int(wc.ByteLen), c.cfg.BufSize)
			c.m.RecvWC(now, slot, c.recvBuf[off:off+n])
			continue
		}
		c.m.SendWC(wc.WRID)
	}
	c.run()
}

// Repost is step 2 of the completion rule (reactor.CQHandler).
func (c *Channel) Repost() {
	if c.tornDown {
		return
	}
	c.m.Repost()
	c.run()
}

// CQError is a Poll/ReqNotify/GetEvent failure of the CQ (reactor.CQErrorHandler).
func (c *Channel) CQError(err error) {
	if c.tornDown {
		return
	}
	c.m.Close(fmt.Errorf("%w: cq: %w", ErrPeerError, err))
	c.run()
}

func (c *Channel) onTimer() {
	if c.tornDown {
		return
	}
	c.m.Tick(c.loop.Now())
	c.run()
}

// run performs the machine's actions until it has none; callbacks that call back into the
// channel only add actions, picked up by the same loop.
func (c *Channel) run() {
	if c.running {
		return
	}
	c.running = true
	for {
		acts := c.m.Ready()
		if len(acts) == 0 {
			break
		}
		for i := range acts {
			c.perform(&acts[i])
		}
		_ = c.flushRecvs() // a failure closes the machine, which reports it
		c.flushSends()
	}
	c.running = false
	if c.closed && !c.tornDown {
		c.tornDown = true
		c.release()
		if !c.starting {
			c.ev.OnClosed(c.closeErr)
		}
	}
}

func (c *Channel) perform(a *Action) {
	switch a.Kind {
	case ActPostRecv:
		if c.closed || c.recvMR == nil || c.draining {
			return // before the rings exist: Connect or Ready posts every slot
		}
		off := uint64(a.Slot * c.cfg.BufSize)
		c.rsge[c.nrwr] = ibv.SGE{Addr: c.recvMR.Addr() + off, Length: uint32(c.cfg.BufSize), LKey: c.recvMR.LKey()}
		c.rwr[c.nrwr].WRID = recvWRIDBit | uint64(a.Slot)
		c.nrwr++
		if c.nrwr == len(c.rwr) {
			_ = c.flushRecvs() // a failure closes the machine, which reports it
		}
	case ActPostSend:
		if c.closed || c.draining {
			return
		}
		off := uint64(a.Slot * c.cfg.BufSize)
		w := &c.swr[c.nswr]
		c.ssge[c.nswr] = ibv.SGE{Addr: c.sendMR.Addr() + off, Length: uint32(a.Len), LKey: c.sendMR.LKey()}
		w.WRID = a.WRID
		w.SendFlags = 0
		if a.Signaled {
			w.SendFlags |= ibv.SendSignaled
		}
		if a.Len <= c.inline {
			w.SendFlags |= ibv.SendInline
		}
		c.nswr++
		if c.nswr == len(c.swr) {
			c.flushSends()
		}
	case ActDeliver:
		d := Delivery{Session: a.Session, Epoch: a.Epoch, Seq: a.Seq, Name: c.intern(a.Name)}
		if a.Owned {
			d.Msg = a.Msg
		} else {
			d.Msg = c.slab.Copy(a.Msg)
		}
		if len(a.ID) > 0 {
			d.ID = string(a.ID)
		}
		c.ev.OnNotify(d)
	case ActFence:
		c.ev.OnFence(a.Session, a.Seq, a.Count)
	case ActDrop:
		ev := c.drops.Warn()
		if a.Reason == DropDuplicate {
			ev = c.drops.Debug() // expected after a retry on another path
		}
		ev.Err(a.Err).Stringer("reason", a.Reason).Uint32("qp", c.qpn).Msg("ctrlchannel: frame dropped")
	case ActComplete:
		if a.Req.Done != nil {
			a.Req.Done(a.Err)
		}
	case ActSetTimer:
		switch {
		case a.At.IsZero():
			if c.timer != nil {
				c.timer.Stop()
			}
		case c.timer == nil:
			c.timer = c.loop.AfterFunc(a.At.Sub(c.loop.Now()), c.onTimer)
		default:
			c.timer.Reset(a.At.Sub(c.loop.Now()))
		}
	case ActDrain:
		if c.qp == nil {
			c.m.Close(a.Err)
			return
		}
		c.toErr()
		c.drainErr = a.Err
		if err := c.loop.Submit(c.drainClose); err != nil {
			c.m.Close(a.Err) // the loop is stopping: nothing more will be reaped
		}
	case ActClose:
		c.closed = true
		c.closeErr = a.Err
		c.nrwr, c.nswr = 0, 0
	}
}

// intern returns name as a string, without allocating for a name seen before.
func (c *Channel) intern(b []byte) string {
	if s, ok := c.names[string(b)]; ok {
		return s
	}
	s := string(b)
	if len(c.names) < 1024 {
		c.names[s] = s
	}
	return s
}

func (c *Channel) flushRecvs() error {
	if c.nrwr == 0 {
		return nil
	}
	for i := 0; i < c.nrwr; i++ {
		c.rwr[i].Next = nil
		if i+1 < c.nrwr {
			c.rwr[i].Next = &c.rwr[i+1]
		}
	}
	c.nrwr = 0
	if _, err := c.qp.PostRecv(&c.rwr[0]); err != nil {
		c.postErrors++
		err = fmt.Errorf("%w: post recv: %w", ErrPeerError, err)
		c.m.Close(err)
		return err
	}
	return nil
}

func (c *Channel) flushSends() {
	if c.nswr == 0 {
		return
	}
	for i := 0; i < c.nswr; i++ {
		c.swr[i].Next = nil
		if i+1 < c.nswr {
			c.swr[i].Next = &c.swr[i+1]
		}
	}
	tracepoint.Mark(tracepoint.PostSendStart, c.nswr)
	c.nswr = 0
	_, err := c.qp.PostSend(&c.swr[0])
	tracepoint.Mark(tracepoint.PostSendEnd, 0)
	if err != nil {
		c.postErrors++
		c.m.Close(fmt.Errorf("%w: post send: %w", ErrPeerError, err))
	}
}

var _ reactor.CQHandler = (*Channel)(nil)
var _ reactor.CQErrorHandler = (*Channel)(nil)

// randomPSN draws an initial PSN (24 bits) as rc_pingpong does, so that a stale packet of an
// earlier QP that had the same number is not taken as this one's.
func randomPSN() (uint32, error) {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b[:]) & (1<<24 - 1), nil
}
