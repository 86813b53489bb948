package tests

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/twosided/twosided/ctrlchannel"
	"github.com/twosided/twosided/ibv"
)

// mooncakePeer plays a Mooncake Transfer Engine from the outside, written from the
// behaviour of Mooncake PR #3440 (refs/pull/3440/head: ctrl_channel.cpp, ctrl_plane.cpp,
// rdma_twosided_transport.cpp, transfer_metadata.cpp, transfer_metadata_plugin.cpp):
//
//   - its handshake daemon: one request per TCP connection, u64 little-endian length
//     counting the type byte, the type byte, JSON as jsoncpp's FastWriter prints it
//     (sorted keys, a trailing newline); Connection (0), Notify (2) and Probe (3);
//   - its handshake JSON exactly as TransferHandshakeUtil::encode emits a ctrl desc
//     (fillLocalDesc): payload "", local_nic_path "server@device", local_lid, local_gid
//     in gidBytesToString's form, peer_nic_path "__ctrl__", qp_num [], notify_qp_num,
//     notify_rq_depth, ctrl_channel true, reply_msg; and parseGidString's strictness;
//   - one CtrlChannel per peer server name on a soft RC QP it creates itself (min_rnr_timer
//     12, timeout 14, retry_cnt 7, rnr_retry 7, PSNs 0), every SEND signaled, at most
//     min(max_pending_sends, peer notify_rq_depth) in flight, frames with epoch 0,
//     ack_seq 0, seq from 1 on every new channel, one session per process, no credit
//     frames; each RECV reposted after its WC was dispatched; a frame without the magic
//     taken as a raw notify; typed frames other than NOTIFY_COMPAT ignored;
//   - sendNotifyByName: the ctrl channel when it connects (0 = queued), else the OOB
//     notify (MC_RDMA_NOTIFY_OOB_FALLBACK true).
//
// mode mcMain plays Mooncake main instead: a Connection request gets a reply without any
// ctrl field, and it sends notifies only over OOB; mcRefuse plays PR #3440 with
// MC_RDMA_NOTIFY_ENABLED=false (reply_msg "RDMA notify disabled").
type mooncakePeer struct {
	t       *testing.T
	mode    mcMode
	name    string // server name: ip:port (P2P handshake mode)
	ln      net.Listener
	dev     ibv.Context
	pd      ibv.PD
	port    ibv.PortAttr
	session uint64 // local_ctrl_session_id_: one per process

	rqDepth, bufSize, maxPending, maxInline int

	mu          sync.Mutex
	ch          *mcChannel // ctrl_channels_[peer]; one peer in these tests
	got         []mcNotify
	gotCh       chan struct{} // signalled on every notify
	hold        bool          // a queue-full receiver: RECVs are not reposted
	connections int           // Connection requests served
	frames      map[ctrlchannel.FrameType]int
	malformed   int
	wg          sync.WaitGroup
	stopped     chan struct{}
	closeOnce   sync.Once
}

type mcMode int

const (
	mcPR3440 mcMode = iota
	mcMain
	mcRefuse
	// mcAbandon is PR #3440 whose connectQp fails after twosided's handshake reply (as it
	// did on twosided's old 8×4 GID text: "invalid peer GID"): Mooncake drops its channel
	// and sends over OOB, while twosided has adopted a channel nobody serves (half-open).
	mcAbandon
	// mcBadReply is PR #3440 whose accepting reply carries a GID twosided cannot use, so
	// twosided's own side of the channel fails after a successful handshake (as a
	// refused modify to RTR would): a local failure, not the peer's refusal.
	mcBadReply
)

type mcNotify struct {
	name, msg string
	oob, raw  bool
}

// handshake JSON, as TransferHandshakeUtil encodes and decodes it.
type mcDesc struct {
	Payload       string   `json:"payload"`
	LocalNICPath  string   `json:"local_nic_path"`
	LocalLID      uint16   `json:"local_lid"`
	LocalGID      string   `json:"local_gid"`
	PeerNICPath   string   `json:"peer_nic_path"`
	QPNum         []uint32 `json:"qp_num"`
	NotifyQPNum   *uint32  `json:"notify_qp_num,omitempty"`
	NotifyRQDepth *uint32  `json:"notify_rq_depth,omitempty"`
	CtrlChannel   *bool    `json:"ctrl_channel,omitempty"`
	ReplyMsg      string   `json:"reply_msg"`
}

func newMooncakePeer(t *testing.T, mode mcMode) *mooncakePeer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &mooncakePeer{t: t, mode: mode, name: ln.Addr().String(), ln: ln, session: 0x6d6f6f6e63616b65,
		rqDepth: 64, bufSize: 4096, maxPending: 64, maxInline: 64, gotCh: make(chan struct{}, 1),
		frames: map[ctrlchannel.FrameType]int{}, stopped: make(chan struct{})}
	p.dev, err = ibv.OpenDevice("soft", "soft0")
	require.NoError(t, err)
	p.pd, err = p.dev.AllocPD()
	require.NoError(t, err)
	p.port, err = p.dev.QueryPort(1)
	require.NoError(t, err)
	p.wg.Add(1)
	go p.daemon()
	t.Cleanup(p.close)
	return p
}

func (p *mooncakePeer) close() { p.closeOnce.Do(p.doClose) }

func (p *mooncakePeer) doClose() {
	close(p.stopped)
	_ = p.ln.Close()
	p.mu.Lock()
	ch := p.ch
	p.ch = nil
	p.mu.Unlock()
	if ch != nil {
		ch.disconnect()
	}
	p.wg.Wait()
	require.NoError(p.t, p.pd.Dealloc())
	require.NoError(p.t, p.dev.Close())
}

func (p *mooncakePeer) nicPath() string { return p.name + "@" + p.dev.Device().Name }

// fastWriter prints v as jsoncpp's FastWriter: keys sorted (encoding/json sorts map keys),
// no spaces, a trailing newline.
func fastWriter(v any) []byte {
	b, _ := json.Marshal(v)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	out, _ := json.Marshal(m)
	return append(out, '\n')
}

// localDesc is fillLocalDesc of a ctrl channel.
func (p *mooncakePeer) localDesc(c *mcChannel) mcDesc {
	qpn, depth, yes := c.qp.QPNum(), uint32(p.rqDepth), true
	return mcDesc{LocalNICPath: p.nicPath(), LocalLID: p.port.LID, LocalGID: gidBytesToString(p.port.GID),
		PeerNICPath: "__ctrl__", QPNum: []uint32{}, NotifyQPNum: &qpn, NotifyRQDepth: &depth, CtrlChannel: &yes}
}

// gidBytesToString is Mooncake's: 16 bytes, "%02x", colon-separated.
func gidBytesToString(g ibv.GID) string {
	parts := make([]string, 16)
	for i, b := range g {
		parts[i] = fmt.Sprintf("%02x", b)
	}
	return strings.Join(parts, ":")
}

// parseGidString is Mooncake's (ctrl_channel.cpp): 16 colon-separated hex numbers, each
// at most 0xff, nothing else.
func parseGidString(s string) (ibv.GID, error) {
	var g ibv.GID
	parts := strings.Split(s, ":")
	if s == "" || len(parts) != 16 {
		return g, fmt.Errorf("invalid peer GID %q", s)
	}
	for i, part := range parts {
		v, err := strconv.ParseUint(part, 16, 32)
		if err != nil || v > 0xff {
			return g, fmt.Errorf("invalid peer GID %q", s)
		}
		g[i] = byte(v)
	}
	return g, nil
}

func readMsg(c net.Conn) (byte, []byte, error) {
	var hdr [9]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.LittleEndian.Uint64(hdr[:8])
	if n == 0 || n > 1<<20 {
		return 0, nil, fmt.Errorf("length %d", n)
	}
	body := make([]byte, n-1)
	_, err := io.ReadFull(c, body)
	return hdr[8], body, err
}

func writeMsg(c net.Conn, typ byte, body []byte) error {
	frame := binary.LittleEndian.AppendUint64(nil, uint64(len(body)+1))
	_, err := c.Write(append(append(frame, typ), body...))
	return err
}

// daemon is the handshake daemon: one request per connection, answered, closed.
func (p *mooncakePeer) daemon() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.serve(c)
	}
}

func (p *mooncakePeer) serve(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	typ, body, err := readMsg(c)
	if err != nil {
		return
	}
	var reply []byte
	switch typ {
	case 0: // Connection
		var peer mcDesc
		if json.Unmarshal(body, &peer) != nil {
			return
		}
		reply = fastWriter(p.onConnection(&peer))
	case 2: // Notify
		var n struct {
			Name      string `json:"name"`
			NotifyMsg string `json:"notify_msg"`
		}
		if json.Unmarshal(body, &n) != nil {
			return
		}
		p.push(mcNotify{name: n.Name, msg: n.NotifyMsg, oob: true})
		reply = fastWriter(map[string]string{"name": "", "notify_msg": "success"})
	case 3: // Probe
		reply = fastWriter(map[string]string{"status": "success"})
	default:
		return
	}
	_ = writeMsg(c, typ, reply)
}

// onConnection is onSetupRdmaConnections for a ctrl desc: onSetupCtrlChannel.
func (p *mooncakePeer) onConnection(peer *mcDesc) mcDesc {
	p.mu.Lock()
	p.connections++
	p.mu.Unlock()
	switch {
	case p.mode == mcMain:
		return mcDesc{QPNum: []uint32{}} // no ctrl field at all
	case p.mode == mcRefuse:
		return mcDesc{QPNum: []uint32{}, ReplyMsg: "RDMA notify disabled"}
	case peer.CtrlChannel == nil || !*peer.CtrlChannel:
		return mcDesc{QPNum: []uint32{}, ReplyMsg: "not a ctrl handshake"}
	}
	p.mu.Lock()
	old := p.ch
	p.ch = nil
	p.mu.Unlock()
	if old != nil {
		old.disconnect()
	}
	c, err := p.newChannel()
	if err != nil {
		return mcDesc{QPNum: []uint32{}, ReplyMsg: "CtrlChannel construct failed"}
	}
	if peer.NotifyQPNum == nil || *peer.NotifyQPNum == 0 {
		c.disconnect()
		return mcDesc{QPNum: []uint32{}, ReplyMsg: "Peer notify_qp_num missing"}
	}
	c.limit(peer.NotifyRQDepth)
	local := p.localDesc(c)
	if p.mode == mcBadReply {
		local.LocalGID = "not-a-gid"
	}
	if err := c.connectQP(peer.LocalGID, peer.LocalLID, *peer.NotifyQPNum); err != nil {
		c.disconnect()
		local.ReplyMsg = "CtrlChannel connectQp failed"
		return local
	}
	p.mu.Lock()
	p.ch = c
	p.mu.Unlock()
	return local
}

// connectActive: construct, send the ctrl handshake to peer, connect the QP.
func (p *mooncakePeer) connectActive(peerAddr string) (*mcChannel, error) {
	c, err := p.newChannel()
	if err != nil {
		return nil, err
	}
	conn, err := net.DialTimeout("tcp", peerAddr, 5*time.Second)
	if err != nil {
		c.disconnect()
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if err := writeMsg(conn, 0, fastWriter(p.localDesc(c))); err != nil {
		c.disconnect()
		return nil, err
	}
	typ, body, err := readMsg(conn)
	var peer mcDesc
	if err == nil && (typ != 0 || json.Unmarshal(body, &peer) != nil) {
		err = fmt.Errorf("bad handshake reply type %d: %q", typ, body)
	}
	if err == nil && peer.ReplyMsg != "" {
		err = fmt.Errorf("handshake rejected: %s", peer.ReplyMsg)
	}
	if err == nil && (peer.NotifyQPNum == nil || *peer.NotifyQPNum == 0) {
		err = errors.New("peer has no notify_qp_num")
	}
	if err == nil {
		c.limit(peer.NotifyRQDepth)
		err = c.connectQP(peer.LocalGID, peer.LocalLID, *peer.NotifyQPNum)
	}
	if err == nil && p.mode == mcAbandon {
		err = errors.New("invalid peer GID (abandoned after the handshake reply)")
	}
	if err != nil {
		c.disconnect()
		return nil, err
	}
	return c, nil
}

// ensureChannel is ensureCtrlChannel: the connected channel, or a new one (a dead one is
// reclaimed first).
func (p *mooncakePeer) ensureChannel(peerAddr string) *mcChannel {
	p.mu.Lock()
	c := p.ch
	p.mu.Unlock()
	if c != nil && c.isConnected() {
		return c
	}
	if c != nil {
		p.mu.Lock()
		if p.ch == c {
			p.ch = nil
		}
		p.mu.Unlock()
		c.disconnect()
	}
	c, err := p.connectActive(peerAddr)
	if err != nil {
		return nil
	}
	p.mu.Lock()
	won := p.ch
	if won == nil {
		p.ch = c
	}
	p.mu.Unlock()
	if won != nil { // a passive accept won meanwhile
		c.disconnect()
		return won
	}
	return c
}

// reconnect drops the current channel, as a Mooncake whose channel died; the next send
// builds a new one (new QP, seq from 1 again, same session).
func (p *mooncakePeer) reconnect() {
	p.mu.Lock()
	c := p.ch
	p.ch = nil
	p.mu.Unlock()
	if c != nil {
		c.disconnect()
	}
}

// sendNotifyByName: the ctrl channel (0 = queued), else OOB. It reports whether the notify
// was queued on the ctrl channel.
func (p *mooncakePeer) sendNotifyByName(peerAddr, name, msg string) (ctrl bool, err error) {
	if p.mode == mcPR3440 || p.mode == mcAbandon {
		if c := p.ensureChannel(peerAddr); c != nil {
			if c.sendNotify(name, msg) == nil {
				return true, nil
			}
		}
	}
	return false, p.sendOOBNotify(peerAddr, name, msg)
}

func (p *mooncakePeer) sendOOBNotify(peerAddr, name, msg string) error {
	conn, err := net.DialTimeout("tcp", peerAddr, 5*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if err := writeMsg(conn, 2, fastWriter(map[string]string{"name": name, "notify_msg": msg})); err != nil {
		return err
	}
	typ, body, err := readMsg(conn)
	if err != nil {
		return err
	}
	var r struct {
		NotifyMsg string `json:"notify_msg"`
	}
	if typ != 2 || json.Unmarshal(body, &r) != nil || r.NotifyMsg == "" {
		return fmt.Errorf("notify rejected: %q", body)
	}
	return nil
}

func (p *mooncakePeer) push(n mcNotify) {
	p.mu.Lock()
	p.got = append(p.got, n)
	p.mu.Unlock()
	select {
	case p.gotCh <- struct{}{}:
	default:
	}
}

// received is a copy of what it got so far.
func (p *mooncakePeer) received() []mcNotify {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]mcNotify(nil), p.got...)
}

// waitReceived waits until it got n notifies.
func (p *mooncakePeer) waitReceived(t *testing.T, n int, within time.Duration) []mcNotify {
	t.Helper()
	deadline := time.After(within)
	for {
		if got := p.received(); len(got) >= n {
			return got
		}
		select {
		case <-p.gotCh:
		case <-deadline:
			t.Fatalf("Mooncake peer got %d of %d notifies", len(p.received()), n)
		}
	}
}

// setHold makes it a queue-full receiver (true: RECVs are not reposted) or releases it.
func (p *mooncakePeer) setHold(on bool) {
	p.mu.Lock()
	p.hold = on
	c := p.ch
	p.mu.Unlock()
	if !on && c != nil {
		c.releaseHeld()
	}
}

// mcChannel is one CtrlChannel.
type mcChannel struct {
	p       *mooncakePeer
	cc      ibv.CompChannel
	cq      ibv.CQ
	qp      ibv.QP
	sendBuf []byte
	recvBuf []byte
	sendMR  ibv.MR
	recvMR  ibv.MR

	mu         sync.Mutex
	cond       *sync.Cond
	connected  bool
	maxPending int
	pending    int
	sendWRID   uint64
	nextSeq    uint64 // next_frame_seq_, from 1 on every channel
	acked      uint64 // SENDs whose WC succeeded
	held       []int  // RECV slots kept while holding
	stop       chan struct{}
	done       chan struct{}
	once       sync.Once
}

func (p *mooncakePeer) newChannel() (*mcChannel, error) {
	c := &mcChannel{p: p, maxPending: p.maxPending, nextSeq: 1, stop: make(chan struct{}), done: make(chan struct{})}
	c.cond = sync.NewCond(&c.mu)
	var err error
	if c.cc, err = p.dev.CreateCompChannel(); err != nil {
		return nil, err
	}
	if c.cq, err = p.dev.CreateCQ(p.maxPending+p.rqDepth, c.cc); err != nil {
		return nil, err
	}
	c.qp, err = p.pd.CreateQP(ibv.QPInitAttr{SendCQ: c.cq, RecvCQ: c.cq, Type: ibv.QPTypeRC,
		Cap: ibv.QPCap{MaxSendWR: uint32(p.maxPending), MaxRecvWR: uint32(p.rqDepth), MaxSendSGE: 1, MaxRecvSGE: 1,
			MaxInlineData: uint32(p.maxInline)}})
	if err != nil {
		return nil, err
	}
	if err := c.qp.Modify(&ibv.QPAttr{QPState: ibv.QPSInit, PortNum: 1, QPAccessFlags: ibv.AccessLocalWrite},
		ibv.AttrState|ibv.AttrPKeyIndex|ibv.AttrPort|ibv.AttrAccessFlags); err != nil {
		return nil, err
	}
	c.sendBuf = make([]byte, p.bufSize*p.maxPending)
	c.recvBuf = make([]byte, p.bufSize*p.rqDepth)
	if c.sendMR, err = p.pd.RegMR(c.sendBuf, ibv.AccessLocalWrite); err != nil {
		return nil, err
	}
	if c.recvMR, err = p.pd.RegMR(c.recvBuf, ibv.AccessLocalWrite); err != nil {
		return nil, err
	}
	for i := 0; i < p.rqDepth; i++ {
		if err := c.postRecv(i); err != nil {
			return nil, err
		}
	}
	p.wg.Add(1)
	go c.worker()
	return c, nil
}

// limit: max_pending_sends_ = min(max_pending_sends_, peer notify_rq_depth).
func (c *mcChannel) limit(depth *uint32) {
	if depth != nil && *depth != 0 && int(*depth) < c.maxPending {
		c.maxPending = int(*depth)
	}
}

func (c *mcChannel) connectQP(gid string, lid uint16, qpn uint32) error {
	g, err := parseGidString(gid)
	if err != nil {
		return err
	}
	mtu := ibv.MinMTU(c.p.port.ActiveMTU, ibv.MTU4096)
	if err := c.qp.Modify(&ibv.QPAttr{QPState: ibv.QPSRTR, PathMTU: mtu,
		AHAttr:    ibv.AHAttr{IsGlobal: true, DGID: g, HopLimit: 16, DLID: lid, PortNum: 1},
		DestQPNum: qpn, RqPSN: 0, MaxDestRdAtomic: 1, MinRNRTimer: 12},
		ibv.AttrState|ibv.AttrPathMTU|ibv.AttrMinRNRTimer|ibv.AttrAV|ibv.AttrMaxDestRdAtomic|ibv.AttrDestQPN|ibv.AttrRqPSN); err != nil {
		return err
	}
	if err := c.qp.Modify(&ibv.QPAttr{QPState: ibv.QPSRTS, Timeout: 14, RetryCnt: 7, RnrRetry: 7, SqPSN: 0, MaxRdAtomic: 1},
		ibv.AttrState|ibv.AttrTimeout|ibv.AttrRetryCnt|ibv.AttrRnrRetry|ibv.AttrSqPSN|ibv.AttrMaxQPRdAtomic); err != nil {
		return err
	}
	c.mu.Lock()
	c.connected = true
	c.mu.Unlock()
	return nil
}

func (c *mcChannel) isConnected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.connected
}

func (c *mcChannel) postRecv(slot int) error {
	off := uint64(slot * c.p.bufSize)
	_, err := c.qp.PostRecv(&ibv.RecvWR{WRID: uint64(slot),
		SGList: []ibv.SGE{{Addr: c.recvMR.Addr() + off, Length: uint32(c.p.bufSize), LKey: c.recvMR.LKey()}}})
	return err
}

// sendNotify is CtrlChannel::sendNotify: encode, wait for a send slot, post; 0 = queued.
func (c *mcChannel) sendNotify(name, msg string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.connected {
		return errors.New("ERR_ENDPOINT")
	}
	frame := make([]byte, ctrlchannel.HeaderLen+ctrlchannel.NotifyCompatLen(name, []byte(msg)))
	h := ctrlchannel.Header{Session: c.p.session, Epoch: 0, Seq: c.nextSeq}
	c.nextSeq++
	n, err := ctrlchannel.EncodeNotifyCompat(frame, &h, name, []byte(msg))
	if err != nil {
		return err
	}
	if n > c.p.bufSize {
		return fmt.Errorf("frame too large (%d > %d)", n, c.p.bufSize)
	}
	for c.connected && c.pending >= c.maxPending {
		c.cond.Wait()
	}
	if !c.connected {
		return errors.New("ERR_ENDPOINT")
	}
	slot := int(c.sendWRID % uint64(c.maxPending))
	copy(c.sendBuf[slot*c.p.bufSize:], frame[:n])
	flags := ibv.SendSignaled
	if n <= c.p.maxInline {
		flags |= ibv.SendInline
	}
	wr := &ibv.SendWR{WRID: c.sendWRID, Opcode: ibv.WRSend, SendFlags: flags,
		SGList: []ibv.SGE{{Addr: c.sendMR.Addr() + uint64(slot*c.p.bufSize), Length: uint32(n), LKey: c.sendMR.LKey()}}}
	c.sendWRID++
	if _, err := c.qp.PostSend(wr); err != nil {
		return err
	}
	c.pending++
	return nil
}

// worker is the ctrl worker: poll the CQ, handle every WC (a RECV is dispatched, then
// its buffer reposted), arm, wait on the completion channel.
func (c *mcChannel) worker() {
	defer c.p.wg.Done()
	defer close(c.done)
	wcs := make([]ibv.WC, 16)
	for {
		n, err := c.cq.Poll(wcs)
		if err != nil {
			return
		}
		for i := 0; i < n; i++ {
			c.handle(&wcs[i])
		}
		if n > 0 {
			continue
		}
		if c.cq.ReqNotify(false) != nil {
			return
		}
		if n, _ = c.cq.Poll(wcs); n > 0 {
			for i := 0; i < n; i++ {
				c.handle(&wcs[i])
			}
			continue
		}
		fds := []unix.PollFd{{Fd: int32(c.cc.Fd()), Events: unix.POLLIN}}
		_, _ = unix.Poll(fds, 20)
		events := 0
		for {
			if _, err := c.cc.GetEvent(); err != nil {
				break
			}
			events++
		}
		c.cq.AckEvents(events)
		select {
		case <-c.stop:
			return
		default:
		}
	}
}

func (c *mcChannel) handle(wc *ibv.WC) {
	if wc.Status != ibv.WCSuccess {
		c.mu.Lock()
		c.connected = false
		c.pending = 0
		c.cond.Broadcast()
		c.mu.Unlock()
		return
	}
	if wc.Opcode == ibv.WCSend {
		c.mu.Lock()
		c.acked++
		if c.pending > 0 {
			c.pending--
		}
		c.cond.Signal()
		c.mu.Unlock()
		return
	}
	slot := int(wc.WRID)
	data := append([]byte(nil), c.recvBuf[slot*c.p.bufSize:slot*c.p.bufSize+int(wc.ByteLen)]...)
	if len(data) > 0 {
		c.dispatch(data)
	}
	c.p.mu.Lock()
	hold := c.p.hold
	c.p.mu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if hold {
		c.held = append(c.held, slot)
		return
	}
	_ = c.postRecv(slot)
}

func (c *mcChannel) releaseHeld() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.held {
		_ = c.postRecv(s)
	}
	c.held = nil
}

// dispatch is dispatchRecvPayload + onCtrlFrameReceived.
func (c *mcChannel) dispatch(b []byte) {
	p := c.p
	if len(b) >= 4 && binary.LittleEndian.Uint32(b) == ctrlchannel.Magic {
		var h ctrlchannel.Header
		payload, err := ctrlchannel.DecodeHeader(b, &h)
		if err != nil || !h.Type.Mooncake() { // decodeCtrlFrame knows types 1..10 only
			p.mu.Lock()
			p.malformed++
			p.mu.Unlock()
			return
		}
		p.mu.Lock()
		p.frames[h.Type]++
		p.mu.Unlock()
		if h.Type != ctrlchannel.TypeNotifyCompat {
			return // ignored (PR2 notify-only)
		}
		var nc ctrlchannel.NotifyCompat
		if ctrlchannel.DecodeNotifyCompat(payload, &nc) != nil {
			p.mu.Lock()
			p.malformed++
			p.mu.Unlock()
			return
		}
		p.push(mcNotify{name: string(nc.Name), msg: string(nc.Msg)})
		return
	}
	var nc ctrlchannel.NotifyCompat
	if len(b) < 8 || ctrlchannel.DecodeNotifyCompat(b, &nc) != nil {
		p.mu.Lock()
		p.malformed++
		p.mu.Unlock()
		return
	}
	p.push(mcNotify{name: string(nc.Name), msg: string(nc.Msg), raw: true})
}

// acked is the number of SENDs of the current channel whose completion succeeded.
func (p *mooncakePeer) acked() uint64 {
	p.mu.Lock()
	c := p.ch
	p.mu.Unlock()
	if c == nil {
		return 0
	}
	return c.ackedSends()
}

// ackedSends is the number of SENDs whose completion succeeded (what Mooncake calls
// delivered).
func (c *mcChannel) ackedSends() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.acked
}

// disconnect is CtrlChannel::disconnect: not connected, waiters woken, IB resources freed.
func (c *mcChannel) disconnect() {
	c.once.Do(func() {
		c.mu.Lock()
		c.connected = false
		c.pending = 0
		c.cond.Broadcast()
		c.mu.Unlock()
		close(c.stop)
		<-c.done
		_ = c.qp.Destroy()
		_ = c.cq.Destroy()
		_ = c.cc.Close()
		_ = c.sendMR.Dereg()
		_ = c.recvMR.Dereg()
	})
}
