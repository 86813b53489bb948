package notify

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"net/netip"
	"slices"
	"time"

	"github.com/twosided/twosided/reactor"
)

// peerMachine is every decision the engine makes about peers, as a pure state machine in
// the style of ctrlchannel.Machine: events go in (a send, a handshake's result, a peer's
// handshake, a channel's end, a send's result, an arrival, time), actions come out (connect,
// post, send over OOB, complete, close a channel, fence, deliver, set the timer). It makes
// no syscalls, starts no goroutines and never reads the clock. The engine's driver (engine.go,
// peer.go, handshake.go) owns channels, sockets and callers, and performs the actions.
//
// Identity. A peer is the remote engine's session, learned at handshake; the names it was
// reached by (host:port strings) and the name it advertised are aliases of one peer entry,
// so two names for one engine share one channel and one sequence space. A Mooncake peer has
// no session: it is keyed by its name and marked legacy.
//
// Sequence spaces. Each (this session, peer session) pair has one seqSpace on the send side
// and one recvWindow on the receive side. A seq is drawn only when a notify is posted on a
// channel or sent over OOB, never for a notify that waits or is refused. A send that
// fails on a channel is retried with the same seq on the peer's newer channel, or over
// OOB; a seq given up is fenced, so the receiver never waits for it.
//
// Channels. At most one channel per peer is current. Between two channels of one pair the
// one with the higher (epoch, initiator session) wins on both sides, so a simultaneous
// open, a straggling handshake or a second name converges on one channel without a
// refusal round. The loser is drained (what its NIC acknowledged is delivered) and closed;
// its sends are reposted with their seqs on the winner.
//
// Tokens. A pair's OOB notifies carry a token the receiving side issued in that pair's own
// handshake; a notify with a session and a wrong token is refused, so a session learned
// from a handshake reply to someone else is useless. A handshake that claims a session the
// engine already knows must prove the token it was given (ts_proof).
type peerMachine struct {
	local    uint64
	cfg      machineConfig
	rand     func() uint64
	mac      hash.Hash // HMAC-SHA256 under a per-engine key (cookie)
	macSum   [sha256.Size]byte
	offered  map[uint64]string // tokens of our handshakes in flight -> the name (offer)
	doneReqs []*reqEntry       // completed since the last ready (recycleReqs)
	unheld   []string          // names whose last straggler was answered (releaseStragglers)
	freeReqs reactor.FreeList[reqEntry]

	names map[string]*nameEntry
	peers map[peerKey]*peerEntry
	chans map[chanID]*chanEntry
	reqs  map[reqID]*reqEntry

	nextChan    chanID
	inflight    int // sends posted on channels and not completed, all peers
	channels    int // channels up or being created
	unconfirmed int // inbound channels their peer has not used yet
	// Peer entries made by a peer's handshake and not yet confirmed (see peerEntry.confirmed),
	// in all and per source address: capped, and evicted first when the table is full.
	unconfirmedPeers int
	unconfirmedBy    map[netip.Addr]int
	connects         int      // our handshakes in flight
	connectQ         []string // names waiting for a handshake slot, in order
	timerAt          time.Time

	acts  []mAction
	spare []mAction // the other buffer of ready
	stats machineStats
}

type chanID uint64
type reqID uint64

// peerKey identifies a peer: its session, or, for a Mooncake peer (session 0), its name.
type peerKey struct {
	session uint64
	legacy  string
}

type machineConfig struct {
	channels        bool // rdma_twosided: this engine opens ctrl channels
	fallback        bool // retry a failed channel send over OOB
	maxNames        int  // name entries (aliases, names being connected)
	maxPeers        int  // peer entries
	maxChannels     int
	maxPendingSends int // per peer: sends waiting for a channel or room, and posted on a channel
	window          int // unresolved seqs per pair, and the receiver's window
	idCap           int // idempotency ids remembered per window
	connectTimeout  time.Duration
	noCtrlRetry     time.Duration // a peer without a ctrl channel is served over OOB for this long
	limitBackoff    time.Duration // a peer that refused for a limit is not asked again for this long
	fenceRetry      time.Duration // first wait before an OOB fence the peer refused is sent again; doubles up to limitBackoff
	gapTimeout      time.Duration // a receive gap nobody fills or fences is given up after this
	peerIdle        time.Duration // an idle peer entry without a channel is forgotten after this
	maxUnconfirmed  int           // inbound channels not yet used by their peer
	maxConnects     int           // our handshakes in flight at once (each holds a channel)
	maxNotifySize   int           // this engine's max_notify_size (named in refusals)
}

func (c *machineConfig) setDefaults() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.maxNames, 4096)
	def(&c.maxPeers, 1024)
	def(&c.maxChannels, 1024)
	def(&c.maxPendingSends, 64)
	def(&c.window, 8192)
	def(&c.idCap, 256)
	def(&c.maxUnconfirmed, 64)
	def(&c.maxConnects, 64)
	defd := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	defd(&c.connectTimeout, 10*time.Second)
	defd(&c.noCtrlRetry, 30*time.Second)
	defd(&c.limitBackoff, 5*time.Second)
	defd(&c.fenceRetry, 50*time.Millisecond)
	defd(&c.gapTimeout, 60*time.Second)
	defd(&c.peerIdle, 10*time.Minute)
}

type peerMode uint8

const (
	modeChannel peerMode = iota // sends go on the peer's ctrl channel
	modeOOB                     // the pair has no ctrl channel: sends go over OOB with seqs
)

type nameEntry struct {
	name       string
	peer       *peerEntry
	connecting bool    // our handshake via this name is in flight
	queued     bool    // waiting in connectQ for a handshake slot
	token      uint64  // the token we offered in that handshake
	kept       bool    // that handshake went while we held state for the pair (seqs, a window)
	waiters    []reqID // sends to this name before its peer is known
	legacyOOB  bool    // the name is a Mooncake engine without ctrl channel: seq-less OOB
	retryAt    time.Time
	lastUsed   time.Time
	// Connect backoff: failures counts our handshakes via this name that failed in a row
	// (unreachable, refused, no ctrl channel with fallback off, a local verbs failure); no
	// handshake goes before backoffAt; meanwhile a send waits for it when its deadline
	// allows, else fails with backoffErr (or goes over OOB when fallback is on and the pair
	// has a token). A success resets it.
	failures   int
	backoffAt  time.Time
	backoffErr error
	// stragglers counts sends via this name still on their way to the pair it led to
	// before a rebind. Their refusals come back in any order and are sent again in the
	// new pair: until all are answered, the name's waiters stay here (not moved to the
	// new peer), so the new seqs are drawn in send order.
	stragglers int
}

type peerEntry struct {
	key      peerKey
	names    []string // aliases; names[0] is the name the peer advertised, if any
	adv      string   // the name the peer gave in its last handshake: Notify.Peer when names is empty (a rebind took them)
	mode     peerMode
	ch       chanID // current channel, 0: none
	epoch    uint64 // highest epoch seen for the pair
	awaiting time.Time

	tokenIn  [2]uint64 // what the peer must present (ts_token) on OOB notifies and ts_proof
	tokenOut uint64    // what we present to it

	seqs     *seqSpace
	win      *recvWindow
	waiters  []reqID // accepted, no seq yet
	inflight int     // posted on a channel, not completed
	// oldInflight: posted on a channel since replaced and not completed. Towards a Mooncake
	// peer (no seqs, no receive window) nothing is posted on the new channel until they
	// completed or came back, so replacement keeps the order.
	oldInflight int

	lastActive time.Time
	born       time.Time // when the entry was made
	bornActive bool      // made by the reply to our own handshake
	retryAt    time.Time // connect backoff after a limit refusal
	lastErr    error
	// fenceAt: an OOB fence was refused; no fence goes over OOB before then (tick sends
	// them), so a refusing peer sees one try per fenceWait, not a storm. A channel, or a
	// new token from a handshake, carries them at once.
	fenceAt   time.Time
	fenceWait time.Duration
	forgotten bool // the peer refused our token: it no longer knows the pair (rebind)
	// confirmed: the peer proved the entry is its own: it answered our handshake, used the
	// pair's token or channel, or we sent to it. An entry a handshake made is unconfirmed
	// until then: those are capped per source address and evicted first (oldest first)
	// when the table is full, so a flood of handshakes can neither push out nor lock out
	// peers that talk. from: the address of the handshake that made it (when known).
	confirmed bool
	from      netip.Addr
	// maxNotify is the largest name+msg the peer delivers (its handshake's ts_max_notify;
	// 0: not said): a larger notify is refused here, before a seq is drawn.
	maxNotify int

	sent, received, dups uint64
}

type chanEntry struct {
	id        chanID
	peer      *peerEntry
	name      string // the name our handshake went to (active side)
	epoch     uint64
	initiator uint64
	up        bool
	legacy    bool
	dropped   bool // no longer the peer's nor counted; kept until the driver closed it
	postNo    uint64
	fences    []fenceRec // posted on this channel, not yet known to have arrived
	// inbound channels are unconfirmed until the peer uses them (a frame arrives, or a send
	// of ours completes): a handshake naming a QPN that exists nowhere makes a channel no
	// frame ever confirms, so unconfirmed ones are capped and expire.
	inbound   bool
	confirmed bool
	born      time.Time
	// maxSize is the largest name+msg the channel carries (0: not known yet): below the
	// peer's limit when the channel cannot fragment (a Mooncake peer, a RECV ring too
	// small for credit flow control); a larger notify goes over OOB or is refused.
	maxSize int
}

// fenceRec is a fence posted on a channel after its post number after: it is known to have
// arrived when a send posted later on the same channel completes (RC delivers in order).
type fenceRec struct {
	r     seqRange
	after uint64
}

type reqEntry struct {
	id       reqID
	name     string
	peer     *peerEntry
	seq      uint64
	ch       chanID // posted on; 0: not on a channel
	oob      bool   // on its way over OOB
	legacy   bool   // seq-less (Mooncake)
	nid      string
	deadline time.Time
	postNo   uint64
	maybe    bool       // an earlier attempt may have been delivered
	tries    attemptLog // its failed attempts, for the final error (errors.go)
	// straggler: on its way to a pair its name no longer leads to (the peer restarted);
	// the name's new sends wait until it is answered (nameEntry.stragglers).
	straggler bool
	// oobToken: the pair token its last OOB try presented. A refusal of a token the pair
	// has since replaced (a new handshake) is about the old pair, not the current one.
	oobToken uint64
	size     int // name+msg bytes
}

type mActKind uint8

const (
	aConnect  mActKind = iota + 1 // handshake Name (Chan 0: a session handshake without channel)
	aPost                         // post Req on Chan with Seq at Epoch
	aOOB                          // send Req over OOB to Name with Seq (0: legacy), Session, Token
	aComplete                     // complete Req with Err
	aClose                        // drain and close Chan with Err
	aFence                        // tell the peer [First, First+Count) is given up: on Chan, else over OOB to Name
	aDeliver                      // hand N to the application
	aTimer                        // call tick at At
)

type mAction struct {
	kind     mActKind
	name     string
	ch       chanID
	req      reqID
	seq      uint64
	epoch    uint64
	session  uint64
	token    uint64
	proof    uint64
	first    uint64
	count    uint64
	legacy   bool
	err      error
	n        Notify
	at       time.Time
	deadline time.Time
}

type machineStats struct {
	Names, Channels, Unconfirmed           int
	UnconfirmedRefused, UnconfirmedExpired uint64
	PeersRefused, NamesRefused, ChannelsRefused, AuthRefused, Superseded, Reposted, Fallbacks, GivenUp,
	FencesSent, FencesDropped, PairsRestarted, LegacyDelivered, OOBRefused, PeersPruned uint64
	PeersEvicted     uint64
	PeersUnconfirmed int
	// HandshakesFailed: our handshakes that failed (each starts or lengthens a backoff);
	// BackoffRefused: sends refused at once while their peer's handshakes backed off.
	HandshakesFailed, BackoffRefused uint64
	Duplicates                       uint64 // received notifies dropped as duplicates (seq or id)
	ConnectsQueued                   uint64 // handshakes that waited for a slot (maxConnects)
}

func newPeerMachine(local uint64, cfg machineConfig, rnd func() uint64) *peerMachine {
	cfg.setDefaults()
	m := &peerMachine{
		local: local, cfg: cfg, rand: rnd,
		names: make(map[string]*nameEntry), peers: make(map[peerKey]*peerEntry), unconfirmedBy: make(map[netip.Addr]int),
		chans: make(map[chanID]*chanEntry), reqs: make(map[reqID]*reqEntry),
		freeReqs: reactor.FreeList[reqEntry]{Max: maxFreeReqs},
	}
	var key [16]byte
	binary.LittleEndian.PutUint64(key[:8], rnd())
	binary.LittleEndian.PutUint64(key[8:], rnd())
	m.mac = hmac.New(sha256.New, key[:]) // made once: a cookie check allocates nothing
	return m
}

// cookie is the token issued to a session that was refused a channel for max_channels
// and is kept nowhere: a keyed hash of the session and the name it gave, as a SYN cookie.
// Its first OOB notify (which names the sender the same way) proves both (oobArrive) and
// only then makes the peer entry, so refused handshakes leave nothing behind and a real
// peer is still served over OOB, under the name it handshook with.
func (m *peerMachine) cookie(session uint64, name string) uint64 {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], session)
	m.mac.Reset()
	m.mac.Write(b[:])
	m.mac.Write([]byte(name))
	t := binary.LittleEndian.Uint64(m.mac.Sum(m.macSum[:0]))
	return max(t, 1)
}

// ready returns the actions queued since the last call. Two buffers take turns: the one
// returned is written again only after the next call, when its caller is done with it
// (so queuing actions allocates nothing once both have grown). Not re-entrant: the
// driver performs one batch at a time (Engine.perform).
func (m *peerMachine) ready() []mAction {
	m.recycleReqs()
	a := m.acts
	clear(m.spare) // handed out last time and done with: drop what it references
	m.acts, m.spare = m.spare[:0], a
	return a
}

func (m *peerMachine) emit(a mAction) { m.acts = append(m.acts, a) }

func (m *peerMachine) complete(id reqID, err error) {
	if r := m.reqs[id]; r != nil {
		m.unstraggle(r)
		m.doneReqs = append(m.doneReqs, r) // reused once the driver is done with this batch (ready)
	}
	delete(m.reqs, id)
	m.emit(mAction{kind: aComplete, req: id, err: err})
}

// maxFreeReqs bounds the reqEntry free list.
const maxFreeReqs = 1024

// newReq is a cleared reqEntry, from the free list when it has one.
func (m *peerMachine) newReq() *reqEntry {
	if r := m.freeReqs.Get(); r != nil {
		return r
	}
	return &reqEntry{}
}

// recycleReqs moves the entries completed before this call to the free list. Only between
// two events: a machine method may still hold an entry it just completed.
func (m *peerMachine) recycleReqs() {
	for i, r := range m.doneReqs {
		m.doneReqs[i] = nil
		*r = reqEntry{}
		m.freeReqs.Put(r)
	}
	m.doneReqs = m.doneReqs[:0]
}

// ---- sends ----

// send accepts a notify for name (a host:port or an advertised name). nid is the caller's
// idempotency id ("" none).
func (m *peerMachine) send(now time.Time, id reqID, name, nid string, deadline time.Time, size int) {
	ne := m.names[name]
	if ne == nil {
		if len(m.names) >= m.cfg.maxNames {
			m.stats.NamesRefused++
			m.emit(mAction{kind: aComplete, req: id, err: sendErr(ErrLimit, name, "",
				fmt.Errorf("max_names: %d peer names known, the limit", m.cfg.maxNames), false)})
			return
		}
		ne = &nameEntry{name: name}
		m.names[name] = ne
	}
	ne.lastUsed = now
	r := m.newReq()
	r.id, r.name, r.nid, r.deadline, r.size = id, name, nid, deadline, size
	m.reqs[id] = r
	m.setTimer(deadline) // a send that waits past its deadline is withdrawn
	if ne.legacyOOB && now.Before(ne.retryAt) {
		r.legacy, r.oob = true, true
		m.emit(mAction{kind: aOOB, req: id, name: name, legacy: true, deadline: deadline})
		return
	}
	if p := ne.peer; p != nil && len(ne.waiters) == 0 && ne.stragglers == 0 {
		m.enqueue(now, p, r, name)
		return
	}
	if len(ne.waiters) >= m.cfg.maxPendingSends {
		m.complete(id, sendErr(ErrBackpressure, name, "", fmt.Errorf("%d sends already wait for the handshake with %s", len(ne.waiters), name), false))
		return
	}
	ne.waiters = append(ne.waiters, id)
	if !ne.connecting && ne.stragglers == 0 {
		m.connectName(now, ne, nil)
	}
}

// enqueue queues r on its peer and posts what the peer's path allows.
func (m *peerMachine) enqueue(now time.Time, p *peerEntry, r *reqEntry, name string) {
	r.peer = p
	p.lastActive = now
	m.confirmPeer(p) // a peer we send to
	if len(p.waiters) >= m.cfg.maxPendingSends {
		m.complete(r.id, sendErr(ErrBackpressure, m.peerName(p), "",
			fmt.Errorf("%d sends already wait (max_pending_sends)", len(p.waiters)), false))
		return
	}
	p.waiters = append(p.waiters, r.id)
	m.flush(now, p, name)
}

// flush posts p's waiting sends on its path, drawing their seqs, as far as the window and
// the channel's send slots allow. Without a path it starts one.
func (m *peerMachine) flush(now time.Time, p *peerEntry, via string) {
	switch {
	case p.mode == modeOOB:
		for len(p.waiters) > 0 && (p.key.legacy != "" || !p.seqs.full()) {
			r := m.reqs[m.popWaiter(p)]
			if r == nil {
				continue
			}
			if _, err := m.sizeCheck(p, r, nil); err != nil {
				m.complete(r.id, err)
				continue
			}
			m.sendOOB(p, r, false)
		}
	case p.ch != 0 && m.chans[p.ch].up:
		ce := m.chans[p.ch]
		if ce.legacy && p.oldInflight > 0 {
			return // the replaced channel's sends complete or come back first
		}
		for len(p.waiters) > 0 && p.inflight < m.cfg.maxPendingSends && (ce.legacy || !p.seqs.full()) {
			r := m.reqs[m.popWaiter(p)]
			if r == nil {
				continue
			}
			if viaOOB, err := m.sizeCheck(p, r, ce); err != nil {
				if !viaOOB {
					m.complete(r.id, err)
					continue
				}
				m.sendOOB(p, r, true)
				if ce.legacy {
					return // the channel waits until it is answered (oldInflight)
				}
				continue
			}
			if r.seq == 0 && !ce.legacy {
				r.seq = p.seqs.draw()
			}
			m.post(p, r, ce)
		}
	default:
		if len(p.waiters) > 0 {
			m.connectPeer(now, p, via)
		}
	}
}

// sizeCheck says whether r is too large for p (the limit the peer announced: refused, on
// every path) or for ce, the channel it would be posted on (nil: over OOB): then it goes
// over OOB when fallback is on (viaOOB), else it is refused. Refused before a seq is drawn.
func (m *peerMachine) sizeCheck(p *peerEntry, r *reqEntry, ce *chanEntry) (viaOOB bool, err error) {
	switch {
	case p.maxNotify > 0 && r.size > p.maxNotify:
		return false, sendErr(ErrTooLarge, m.peerName(p), "", fmt.Errorf("name+msg %d bytes: above the peer's max_notify_size %d (this engine's is %d)",
			r.size, p.maxNotify, m.cfg.maxNotifySize), false)
	case ce == nil || ce.maxSize == 0 || r.size <= ce.maxSize:
		return false, nil
	case m.cfg.fallback:
		return true, errTooLargeForChannel
	}
	return false, sendErr(ErrTooLarge, m.peerName(p), pathName(true), fmt.Errorf("name+msg %d bytes: the ctrl channel carries at most %d "+
		"(one RECV buffer: the peer cannot reassemble fragments, being a Mooncake engine or having a RECV ring below %d), and OOB fallback is off",
		r.size, ce.maxSize, minFragmentRing), false)
}

// errTooLargeForChannel: a notify that goes over OOB because its channel cannot carry it.
var errTooLargeForChannel = errors.New("too large for the ctrl channel")

// minFragmentRing is the smallest RECV ring (MC_RDMA_NOTIFY_RECV_COUNT) with which twosided
// peers negotiate extensions, fragments among them (ctrlchannel's credit flow control).
const minFragmentRing = 3

// setChanLimit records the largest notify channel ch carries (the driver reads it off the
// connected channel).
func (m *peerMachine) setChanLimit(ch chanID, maxSize int) {
	if ce := m.chans[ch]; ce != nil {
		ce.maxSize = maxSize
	}
}

func (m *peerMachine) popWaiter(p *peerEntry) reqID {
	id := p.waiters[0]
	if len(p.waiters) == 1 {
		p.waiters = p.waiters[:0] // keeps its array: the next send appends without allocating
		return id
	}
	p.waiters = p.waiters[1:]
	return id
}

func (m *peerMachine) post(p *peerEntry, r *reqEntry, ce *chanEntry) {
	r.ch, r.oob = ce.id, false
	ce.postNo++
	r.postNo = ce.postNo
	p.inflight++
	m.inflight++
	p.sent++
	m.emit(mAction{kind: aPost, req: r.id, ch: ce.id, seq: r.seq, epoch: ce.epoch, deadline: r.deadline})
}

func (m *peerMachine) sendOOB(p *peerEntry, r *reqEntry, retry bool) {
	r.ch, r.oob = 0, true
	if p.key.legacy != "" {
		// A Mooncake peer: seq-less, in order on one OOB queue; nothing goes on a new
		// channel before these are answered.
		r.legacy = true
		p.oldInflight++
		m.emit(mAction{kind: aOOB, req: r.id, name: m.peerName(p), legacy: true, deadline: r.deadline})
		return
	}
	if r.seq == 0 {
		r.seq = p.seqs.draw()
	}
	if retry {
		m.stats.Fallbacks++
	}
	r.oobToken = p.tokenOut
	m.emit(mAction{kind: aOOB, req: r.id, name: m.peerName(p), seq: r.seq, session: p.key.session,
		token: p.tokenOut, deadline: r.deadline})
}

// cancel withdraws a send whose caller stopped waiting. A send not yet posted is
// completed with ErrTimeout (not delivered) and reports true; a posted one goes on (its
// outcome is unknown to the caller) and reports false.
func (m *peerMachine) cancel(id reqID, err error) bool {
	r := m.reqs[id]
	if r == nil {
		return false
	}
	if r.ch != 0 || r.oob {
		return false
	}
	drop := func(ws []reqID) []reqID {
		for i, w := range ws {
			if w == id {
				return append(ws[:i:i], ws[i+1:]...)
			}
		}
		return ws
	}
	if ne := m.names[r.name]; ne != nil {
		ne.waiters = drop(ne.waiters)
	}
	if r.peer != nil {
		r.peer.waiters = drop(r.peer.waiters)
	}
	m.complete(id, sendErr(ErrTimeout, r.name, "", err, false))
	return true
}

// unstraggle: r, a straggler, is answered (completed, or refused and sent again in the
// new pair); the last one of its name releases the name's waiters (releaseStragglers).
func (m *peerMachine) unstraggle(r *reqEntry) {
	if !r.straggler {
		return
	}
	r.straggler = false
	if ne := m.names[r.name]; ne != nil && ne.stragglers > 0 {
		ne.stragglers--
		if ne.stragglers == 0 {
			m.unheld = append(m.unheld, ne.name)
		}
	}
}

// releaseStragglers sends on what waited behind the stragglers of a name that has none
// left: to the new peer when the name leads to one, else through a new handshake.
func (m *peerMachine) releaseStragglers(now time.Time) {
	for len(m.unheld) > 0 {
		name := m.unheld[0]
		m.unheld = m.unheld[1:]
		ne := m.names[name]
		if ne == nil || ne.stragglers > 0 || len(ne.waiters) == 0 {
			continue
		}
		switch {
		case ne.peer != nil:
			p := ne.peer
			m.moveWaiters(ne, p)
			m.flush(now, p, name)
		case !ne.connecting:
			m.connectName(now, ne, nil)
		}
	}
	m.unheld = nil
}

// sendResult is the outcome of a post (ch != 0) or an OOB send of req. maybe says whether
// a failed attempt may have reached the peer; local says the failure is ours (a deadline,
// a size), not the path's, so no other path is tried.
func (m *peerMachine) sendResult(now time.Time, id reqID, err error, maybe, local bool) {
	r := m.reqs[id]
	if r == nil {
		return
	}
	defer m.releaseStragglers(now)
	p := r.peer
	onCh := r.ch
	if r.oob && r.legacy && p != nil && p.oldInflight > 0 {
		p.oldInflight--
	}
	if onCh != 0 && p != nil {
		p.inflight--
		m.inflight--
		if ce := m.chans[onCh]; (ce == nil || ce.dropped) && p.oldInflight > 0 {
			p.oldInflight--
		}
	}
	r.ch, r.oob = 0, false
	if err != nil {
		r.tries.record(pathName(onCh != 0), err, maybe)
	}
	if err != nil && maybe {
		r.maybe = true
	}
	maybe = maybe || r.maybe
	if err == nil {
		if p != nil && !r.legacy && r.seq != 0 {
			p.seqs.resolve(r.seq)
		}
		if ce := m.chans[onCh]; ce != nil && p != nil {
			m.confirm(ce)
			m.confirmFences(p, ce, r.postNo)
		}
		m.complete(id, nil)
		if p != nil {
			p.lastActive = now
			m.flush(now, p, "")
		}
		return
	}
	kind := ErrPeerUnreachable
	if local {
		kind = ErrTimeout
	}
	var ke *kindError
	if errors.As(err, &ke) {
		kind = ke.kind
	}
	if p == nil || r.legacy {
		m.complete(id, r.tries.sendErr(kind, r.name, pathName(onCh != 0), err, maybe))
		return
	}
	// A refusal is the peer's answer (the notify is invalid there, or its seq was given
	// up): final for this seq; other failures are the path's and may be retried.
	retry := !local && !now.After(r.deadline) && !errors.Is(err, errGaveUp) && !errors.Is(err, ErrRejected)
	// A refusal of the token of a pair since renewed (a handshake gave us a new one while
	// this try was on its way) says nothing of the current pair: it must not be torn down.
	stale := p.staleRefusal(err, r.oobToken)
	if retry && r.straggler {
		// On its way to a pair its name no longer leads to, or one the peer renewed (it
		// forgot us and kept its session): its seq belongs to that pair, and the name's
		// other sends went back in line with new seqs. Not delivered, it joins them in send
		// order; maybe delivered, the caller learns "unknown" (below).
		if !r.maybe && m.rebind(now, p, r, stale) {
			return
		}
		retry = false
	}
	if retry {
		if p.ch != 0 && p.ch != onCh && m.chans[p.ch].up {
			// Its channel was replaced, or OOB failed while a channel is up: the same seq
			// goes on the current channel. Towards a Mooncake peer it goes back in line,
			// in its place, so the order holds without a receive window.
			m.stats.Reposted++
			if m.chans[p.ch].legacy {
				i, _ := slices.BinarySearch(p.waiters, r.id)
				p.waiters = slices.Insert(p.waiters, i, r.id)
				m.flush(now, p, "")
				return
			}
			m.post(p, r, m.chans[p.ch])
			return
		}
		if stale && !r.maybe {
			// Sent again in the current pair, with its seq.
			m.sendOOB(p, r, false)
			return
		}
		if errors.Is(err, errRebind) && !r.maybe && m.rebind(now, p, r, false) {
			// The peer no longer knows this pair (it restarted, or forgot us): handshake
			// again and send the notify in the new pair. It was refused, so it was not
			// delivered — unless an earlier attempt may have landed at the engine that
			// went away: then the caller learns "unknown" rather than risk a duplicate.
			return
		}
		if onCh != 0 && m.cfg.fallback && (p.tokenOut != 0 || p.key.legacy != "") {
			m.sendOOB(p, r, true)
			return
		}
	}
	// Given up: the receiver is told, so it never waits for this seq.
	m.stats.GivenUp++
	p.seqs.giveUp(r.seq)
	m.fence(p)
	m.complete(id, r.tries.sendErr(kind, m.peerName(p), pathName(onCh != 0), err, maybe))
	m.flush(now, p, "")
}

// errGaveUp marks a refusal that means the receiver gave the seq up (its gap timed out):
// not delivered, and never to be sent again under that seq.
var errGaveUp = errors.New("notify: the receiver gave this seq up")

// errRebind marks a refusal that means the peer does not know the pair any more.
var errRebind = errors.New("notify: the peer does not know this pair")

// staleRefusal reports whether err refused token, a token of p's pair that a handshake
// has since replaced: the refusal is about the old pair, not the current one.
func (p *peerEntry) staleRefusal(err error, token uint64) bool {
	return token != 0 && p.tokenOut != 0 && token != p.tokenOut && errors.Is(err, errRebind)
}

// rebind forgets that r's name leads to p, and sends r again through a new handshake.
// p's seq of r is given up (fenced in case p is still alive and merely forgot its token).
// stale: the refusal was of a token p has since replaced; the name keeps p and its
// current pair, and r goes back in line for it.
func (m *peerMachine) rebind(now time.Time, p *peerEntry, r *reqEntry, stale bool) bool {
	ne := m.names[r.name]
	if ne == nil {
		return false
	}
	if r.seq != 0 {
		p.seqs.giveUp(r.seq)
		r.seq = 0
	}
	m.unstraggle(r)
	r.peer = nil // not one of the stragglers marked below
	// A stale refusal leaves the current pair as it is.
	if ne.peer == p && !stale {
		p.forgotten = true
		m.unalias(p, r.name)
		ne.peer = nil
		for _, id := range p.waiters {
			if w := m.reqs[id]; w != nil && w.name == r.name {
				w.peer = nil
				ne.waiters = append(ne.waiters, id)
			}
		}
		p.waiters = slices.DeleteFunc(p.waiters, func(id reqID) bool { w := m.reqs[id]; return w == nil || w.peer == nil })
		p.tokenOut = 0
		// The name's other sends on their way to p are refused too, in any order.
		m.markStragglers(ne, nil)
	}
	i, _ := slices.BinarySearch(ne.waiters, r.id) // in send order (ids grow with each send)
	ne.waiters = slices.Insert(ne.waiters, i, r.id)
	if ne.stragglers > 0 {
		return true // releaseStragglers moves them on once the last straggler is answered
	}
	switch {
	case ne.peer != nil: // rebound meanwhile: the new pair takes it
		m.unheld = append(m.unheld, ne.name)
		m.releaseStragglers(now)
	case !ne.connecting:
		m.connectName(now, ne, nil)
	}
	return true
}

// kindError lets a driver say which sentinel a send failure is.
type kindError struct {
	kind  error
	cause error
}

func (k *kindError) Error() string   { return k.cause.Error() }
func (k *kindError) Unwrap() []error { return []error{k.kind, k.cause} }

func pathName(channel bool) string {
	if channel {
		return "rdma_twosided"
	}
	return "oob"
}

// fence posts p's given-up ranges on its channel, or over OOB. A range counts as resolved
// only once the peer has it: on a channel when a later send completes, over OOB when the
// peer answers (fenceResult); a range whose fence may be lost is posted again.
func (m *peerMachine) fence(p *peerEntry) {
	if len(p.seqs.fences) == 0 {
		return
	}
	var ce *chanEntry
	if p.ch != 0 && m.chans[p.ch].up {
		ce = m.chans[p.ch]
	} else if p.tokenOut == 0 || !p.fenceAt.IsZero() {
		return // no path now (or backing off): the next channel, handshake or tick carries them
	}
	for _, r := range p.seqs.takeFences() {
		m.stats.FencesSent++
		a := mAction{kind: aFence, name: m.peerName(p), session: p.key.session, token: p.tokenOut,
			first: r.first, count: r.count}
		if ce != nil {
			a.ch = ce.id
			ce.fences = append(ce.fences, fenceRec{r: r, after: ce.postNo})
		}
		m.emit(a)
	}
}

// confirmFences resolves the fences posted on ce before the send numbered postNo, which
// completed.
func (m *peerMachine) confirmFences(p *peerEntry, ce *chanEntry, postNo uint64) {
	k := 0
	for _, f := range ce.fences {
		if f.after < postNo {
			p.seqs.fenced(f.r)
			continue
		}
		ce.fences[k] = f
		k++
	}
	ce.fences = ce.fences[:k]
}

// fenceResult is the peer's answer to a fence sent over OOB.
func (m *peerMachine) fenceResult(now time.Time, session, first, count, token uint64, err error) {
	p := m.peers[peerKey{session: session}]
	if p == nil {
		return
	}
	if err == nil {
		p.seqs.fenced(seqRange{first, count})
		p.fenceWait = 0
		return
	}
	p.seqs.refence(seqRange{first, count})
	if p.staleRefusal(err, token) {
		// The token of a pair since renewed was refused: the current pair gets it now.
		m.fence(p)
		return
	}
	if errors.Is(err, errRebind) || now.Sub(p.lastActive) >= m.cfg.gapTimeout {
		// The peer does not know this pair any more (it restarted, or forgot us), or has
		// not answered for a gap timeout, by which its window gave these seqs up itself:
		// nobody waits for them. Resolved, so the entry can be pruned.
		for _, r := range p.seqs.takeFences() {
			p.seqs.fenced(r)
			m.stats.FencesDropped++
		}
		p.fenceAt, p.fenceWait = time.Time{}, 0
		return
	}
	if p.ch != 0 && m.chans[p.ch].up {
		m.fence(p) // on the channel
		return
	}
	// Refused over OOB (busy, a token the peer no longer knows, unreachable): sending it
	// again at once would be refused again, as fast as the peer answers.
	p.fenceWait = min(max(2*p.fenceWait, m.cfg.fenceRetry), max(m.cfg.limitBackoff, m.cfg.fenceRetry))
	if p.fenceAt.IsZero() {
		p.fenceAt = now.Add(p.fenceWait)
		m.setTimer(p.fenceAt)
	}
}

// ---- connecting ----

func (m *peerMachine) connectPeer(now time.Time, p *peerEntry, via string) {
	if via == "" || m.names[via] == nil || m.names[via].peer != p {
		via = ""
		for _, n := range p.names {
			if ne := m.names[n]; ne != nil {
				via = n
				break
			}
		}
	}
	if via == "" {
		// No name leads to it any more (its names now reach another engine): what waits
		// for it cannot be sent.
		err := p.lastErr
		if err == nil {
			err = sendErr(ErrPeerUnreachable, m.peerName(p), "", errors.New("no name reaches this peer any more"), false)
		}
		m.failPeerWaiters(now, p, err)
		return
	}
	ne := m.names[via]
	if ne.connecting {
		return
	}
	for _, n := range p.names {
		if x := m.names[n]; x != nil && x.connecting {
			return
		}
	}
	if now.Before(p.awaiting) {
		return // the peer's own channel is on its way
	}
	m.connectName(now, ne, p)
}

// connectName starts our handshake via ne. p is the peer behind the name, when known. At
// most maxConnects run at once (each holds a channel with its RECVs posted): the rest wait
// in order for a slot, bounded by their sends' deadlines.
func (m *peerMachine) connectName(now time.Time, ne *nameEntry, p *peerEntry) {
	if p != nil && now.Before(p.retryAt) {
		m.failPeerWaiters(now, p, p.lastErr)
		return
	}
	if ne.failures > 0 && now.Before(ne.backoffAt) {
		m.backingOff(now, ne, p)
		return
	}
	if m.connects >= m.cfg.maxConnects {
		if !ne.queued {
			ne.queued = true
			m.connectQ = append(m.connectQ, ne.name)
			m.stats.ConnectsQueued++
		}
		return
	}
	ne.queued = false
	m.connects++
	ne.connecting = true
	act := mAction{kind: aConnect, name: ne.name}
	ne.kept = p != nil && p.hasState()
	if p != nil {
		act.epoch = p.epoch + 1
		act.session = p.key.session
		act.proof = p.tokenOut
		act.token = p.tokenIn[0]
	} else {
		act.epoch = 1
	}
	if act.token == 0 {
		act.token = m.rand()
	}
	ne.token = act.token
	m.offer(ne)
	if m.cfg.channels && (p == nil || p.mode == modeChannel) {
		if m.channels >= m.cfg.maxChannels {
			m.stats.ChannelsRefused++
			ne.connecting = false
			m.withdraw(ne)
			m.connects--
			err := sendErr(ErrLimit, ne.name, "rdma_twosided", fmt.Errorf("max_channels: %d channels open, the limit", m.cfg.maxChannels), false)
			m.failName(now, ne, err)
			return
		}
		m.nextChan++
		m.channels++
		act.ch = m.nextChan
		m.chans[act.ch] = &chanEntry{id: act.ch, name: ne.name, epoch: act.epoch, initiator: m.local, peer: p}
	}
	m.emit(act)
}

// offer records the token ne's handshake carries while it is in flight (withdraw ends
// it): the peer may use it before its reply reaches us (a simultaneous open, see
// oobArrive). Bounded by the handshakes in flight (maxConnects).
func (m *peerMachine) offer(ne *nameEntry) {
	if m.offered == nil {
		m.offered = make(map[uint64]string)
	}
	if len(m.offered) >= 2*m.cfg.maxConnects {
		m.pruneOffered()
	}
	m.offered[ne.token] = ne.name
}

// pruneOffered drops the tokens of handshakes that ended without a withdraw (their name
// entry went meanwhile).
func (m *peerMachine) pruneOffered() {
	for tok, name := range m.offered {
		if x := m.names[name]; x == nil || !x.connecting || x.token != tok {
			delete(m.offered, tok)
		}
	}
}

func (m *peerMachine) withdraw(ne *nameEntry) {
	if m.offered[ne.token] == ne.name {
		delete(m.offered, ne.token)
	}
}

// nextConnect starts queued handshakes while slots are free.
func (m *peerMachine) nextConnect(now time.Time) {
	for len(m.connectQ) > 0 && m.connects < m.cfg.maxConnects {
		name := m.connectQ[0]
		m.connectQ = m.connectQ[1:]
		ne := m.names[name]
		if ne == nil || !ne.queued || ne.connecting {
			continue
		}
		ne.queued = false
		p := ne.peer
		if len(ne.waiters) > 0 || (p != nil && len(p.waiters) > 0) {
			m.connectName(now, ne, p)
		}
	}
}

// Connect backoff bounds: the first retry waits 75-100 ms, each failure doubles it, up to
// 6-8 s. A peer that is down sees at most about 20 handshakes in its first minute from a
// sender that sends all the time (not one per send), and one that comes back is reached
// again within 8 s.
const (
	connectBackoffMin = 100 * time.Millisecond
	connectBackoffMax = 8 * time.Second
)

// handshakeFailed counts a failed handshake via ne and sets its backoff: a random delay in
// [3d/4, d], d doubling per failure in a row from connectBackoffMin up to connectBackoffMax
// (the random part spreads the retries of many senders).
func (m *peerMachine) handshakeFailed(now time.Time, ne *nameEntry, err error) {
	m.stats.HandshakesFailed++
	ne.failures++
	d := connectBackoffMax
	if ne.failures < 20 {
		d = min(connectBackoffMin<<(ne.failures-1), connectBackoffMax)
	}
	d = d - d/4 + time.Duration(m.rand()%uint64(d/4+1))
	ne.backoffAt, ne.backoffErr = now.Add(d), err
	m.setTimer(ne.backoffAt) // the name entry is kept until then (tick)
}

// backingOff: no new QP or handshake per send while the peer behind ne keeps failing. With
// fallback on, a pair with a token sends over OOB meanwhile; otherwise a send that can
// wait for the next handshake (at backoffAt) waits for it, and the others fail now with
// the failure that started the backoff.
func (m *peerMachine) backingOff(now time.Time, ne *nameEntry, p *peerEntry) {
	err := &backoffError{err: ne.backoffErr, wait: ne.backoffAt.Sub(now)}
	if p != nil && m.cfg.fallback && (p.tokenOut != 0 || p.key.legacy != "") {
		m.failPeerWaiters(now, p, err)
		return
	}
	keep := func(ws []reqID) []reqID {
		out := ws[:0]
		for _, id := range ws {
			r := m.reqs[id]
			switch {
			case r == nil:
			case r.deadline.After(ne.backoffAt):
				out = append(out, id)
			default:
				m.stats.BackoffRefused++
				if r.seq != 0 && r.peer != nil {
					r.peer.seqs.giveUp(r.seq)
				}
				m.complete(id, err)
			}
		}
		return out
	}
	ne.waiters = keep(ne.waiters)
	if p != nil {
		p.waiters = keep(p.waiters)
		m.fence(p)
	}
	m.setTimer(ne.backoffAt) // tick starts the next handshake for what waits
}

// handshakeOK ends ne's backoff.
func (m *peerMachine) handshakeOK(ne *nameEntry) {
	ne.failures, ne.backoffAt, ne.backoffErr = 0, time.Time{}, nil
}

// backoffError is what a send gets while its peer's handshakes back off: the failure that
// started the backoff, and when the next handshake may go.
type backoffError struct {
	err  error
	wait time.Duration
}

func (e *backoffError) Error() string {
	return fmt.Sprintf("%v (handshakes paused after repeated failures; the next in %v, after this send's deadline)", e.err, e.wait.Round(time.Millisecond))
}
func (e *backoffError) Unwrap() error { return e.err }

// hsResult is what our handshake via a name came back with.
type hsResult struct {
	err       error  // transport failure, or a reply we could not use (the kind wrapped)
	refuse    string // the peer's typed refusal
	session   uint64 // the peer's session; 0: a Mooncake peer
	token     uint64 // the token the peer issued us (ts_token)
	epoch     uint64 // the peer's epoch in a refusal ("superseded")
	ctrl      bool   // the channel is connected (ch != 0)
	peerName  string // the name the peer advertised
	noCtrlMsg string
	fresh     bool   // the peer made its state for us just now (ts_fresh)
	maxNotify int    // the peer's max_notify_size (ts_max_notify; 0: not said)
	refuseMsg string // the text of the peer's refusal (which limit, ...)
	// localErr: the handshake succeeded but our own side of the channel failed (a verbs
	// call: modify to RTR, ...): not the peer's refusal.
	localErr error
}

// Refusal codes (oob ts_refuse).
const (
	refuseNoCtrl     = "no_ctrl"
	refuseLimit      = "limit"
	refuseAuth       = "auth"
	refuseClosed     = "closed"
	refuseInvalid    = "invalid"
	refuseBusy       = "busy"
	refuseSuperseded = "superseded"
	refuseStale      = "stale"
)

// connected is the result of our handshake via name on channel ch (0: none).
func (m *peerMachine) connected(now time.Time, name string, ch chanID, res hsResult) {
	m.connects--
	defer m.nextConnect(now)
	ne := m.names[name]
	ce := m.chans[ch]
	closeCh := func(why error) {
		if ce != nil {
			m.dropChan(ce, true)
			m.emit(mAction{kind: aClose, ch: ch, err: why})
		}
	}
	if ne == nil {
		m.pruneOffered() // its name entry went while the handshake was out
		closeCh(ErrClosed)
		return
	}
	ne.connecting = false
	m.withdraw(ne)
	if res.err != nil {
		closeCh(res.err)
		kind := ErrPeerUnreachable
		var ke *kindError
		if errors.As(res.err, &ke) {
			kind = ke.kind // a limit the peer's OOB port said, an auth failure, ...
		}
		err := sendErr(kind, name, "handshake", res.err, false)
		m.handshakeFailed(now, ne, err)
		m.failName(now, ne, err)
		return
	}
	if res.localErr != nil && res.session == 0 {
		// Our side of a Mooncake peer's channel failed: its OOB path serves when fallback
		// allows, the channel is tried again after the backoff.
		closeCh(res.localErr)
		err := sendErr(ErrNoCtrlChannel, name, "rdma_twosided", res.localErr, false)
		m.handshakeFailed(now, ne, err)
		if m.cfg.fallback {
			m.legacyOOB(now, ne, ne.backoffAt)
			return
		}
		m.failName(now, ne, err)
		return
	}
	if res.session == 0 {
		m.connectedLegacy(now, ne, ce, res, closeCh)
		return
	}
	switch res.refuse {
	case refuseAuth:
		closeCh(ErrAuth)
		m.stats.AuthRefused++
		p := m.peers[peerKey{session: res.session}]
		if (p != nil && p.tokenOut != 0) || (p == nil && m.anyConnecting()) {
			// The name is another way to an engine we already talk to (or may be
			// handshaking with by another name): the peer knows our session from that
			// handshake and wants its proof. The name becomes an alias; its sends join the
			// pair, and wait (bounded) for the other handshake when it is still on its way.
			p, err := m.bind(now, ne, res.session, "", false)
			if err != nil {
				m.failName(now, ne, err)
				return
			}
			if p.tokenOut == 0 {
				p.awaiting = now.Add(m.cfg.connectTimeout)
				p.lastErr = sendErr(ErrAuth, name, "handshake", errors.New("the peer refused our token"), false)
				m.setTimer(p.awaiting)
			}
			m.moveWaiters(ne, p)
			m.flush(now, p, "")
			return
		}
		m.failName(now, ne, sendErr(ErrAuth, name, "handshake", errors.New("the peer refused our token"), false))
		return
	case refuseClosed:
		closeCh(ErrClosed)
		err := sendErr(ErrPeerUnreachable, name, "handshake", errors.New("the peer is closing"), false)
		m.handshakeFailed(now, ne, err)
		m.failName(now, ne, err)
		return
	case refuseInvalid, refuseStale:
		closeCh(ErrRejected)
		why := res.refuse
		if res.refuseMsg != "" {
			why += ": " + res.refuseMsg
		}
		err := sendErr(ErrRejected, name, "handshake", fmt.Errorf("refused (%s)", why), false)
		m.handshakeFailed(now, ne, err)
		m.failName(now, ne, err)
		return
	}
	p, err := m.bind(now, ne, res.session, res.peerName, res.fresh && (res.refuse == "" || res.refuse == refuseNoCtrl))
	if err != nil {
		closeCh(err)
		m.failName(now, ne, err)
		return
	}
	p.tokenOut = res.token
	p.fenceAt = time.Time{} // a new token: refused fences may pass now
	if res.maxNotify > 0 {
		p.maxNotify = res.maxNotify
	}
	m.addTokenIn(p, ne.token)
	p.epoch = max(p.epoch, res.epoch)
	switch {
	case res.session == m.local && res.refuse == "":
		// The name is this engine's own: served over OOB, for good (see inbound).
		closeCh(ErrNoCtrlChannel)
		p.mode = modeOOB
		m.handshakeOK(ne)
	case res.localErr != nil || (m.cfg.channels && !m.cfg.fallback && (res.refuse == refuseNoCtrl || (res.refuse == "" && !res.ctrl))):
		// Our side of the channel failed, or the peer serves none: with fallback off
		// nothing goes over OOB; the channel is tried again after the backoff.
		cause := res.localErr
		if cause == nil {
			cause = errors.New("the peer serves no ctrl channel, and OOB fallback is off")
		}
		closeCh(cause)
		err := sendErr(ErrNoCtrlChannel, name, "rdma_twosided", cause, false)
		m.handshakeFailed(now, ne, err)
		p.lastErr = err
		m.moveWaiters(ne, p)
		if m.cfg.fallback && p.tokenOut != 0 {
			m.stats.Fallbacks += uint64(len(p.waiters))
			p.mode = modeOOB
			p.retryAt = ne.backoffAt // then a channel is tried again (tick)
			m.flush(now, p, name)
			return
		}
		m.failPeerWaiters(now, p, err)
		return
	case res.refuse == refuseNoCtrl || (res.refuse == "" && !res.ctrl):
		closeCh(ErrNoCtrlChannel)
		p.mode = modeOOB
		p.lastErr = sendErr(ErrNoCtrlChannel, name, "handshake", errors.New("served over OOB"), false)
		if m.cfg.channels {
			p.retryAt = now.Add(m.cfg.noCtrlRetry)
			m.setTimer(p.retryAt)
		}
	case res.refuse == refuseSuperseded:
		// The pair has (or is getting) a better channel, from the peer's side.
		closeCh(errSuperseded)
		m.stats.Superseded++
		if p.ch == 0 {
			p.awaiting = now.Add(m.cfg.connectTimeout)
			m.setTimer(p.awaiting)
		}
	case res.refuse == refuseBusy:
		// The peer is taking many handshakes at once (a reconnect storm, or a flood it
		// refuses): ask again shortly; the sends wait, bounded by their deadlines.
		closeCh(ErrBackpressure)
		p.lastErr = sendErr(ErrBackpressure, name, "handshake", errors.New("the peer is busy with handshakes"), false)
		if p.ch == 0 {
			p.awaiting = now.Add(busyRetryAfter + time.Duration(m.rand()%uint64(busyRetryAfter)))
			m.setTimer(p.awaiting)
		}
	case res.refuse == refuseLimit:
		closeCh(ErrLimit)
		p.retryAt = now.Add(m.cfg.limitBackoff)
		why := "a limit"
		if res.refuseMsg != "" {
			why = res.refuseMsg
		}
		p.lastErr = sendErr(ErrLimit, name, "handshake", fmt.Errorf("the peer refused: %s", why), false)
		m.setTimer(p.retryAt)
		if m.cfg.fallback && p.tokenOut != 0 {
			// The peer issued us a token: it serves our notifies over OOB meanwhile.
			p.mode = modeOOB
			ne.retryAt = p.retryAt
		} else {
			m.moveWaiters(ne, p)
			m.failPeerWaiters(now, p, p.lastErr)
			return
		}
	case res.refuse != "":
		closeCh(ErrRejected)
		m.failName(now, ne, sendErr(ErrRejected, name, "handshake", fmt.Errorf("refused (%s)", res.refuse), false))
		return
	default:
		ce.peer = p
		if cur := m.chans[p.ch]; p.ch != 0 && cur != nil && !wins(ce, cur) {
			// A simultaneous open: the peer's channel wins on both sides.
			m.stats.Superseded++
			m.dropChan(ce, false)
			m.emit(mAction{kind: aClose, ch: ce.id, err: errSuperseded})
		} else {
			m.adopt(now, p, ce)
		}
	}
	m.handshakeOK(ne) // the peer answered: it is there
	m.moveWaiters(ne, p)
	m.flush(now, p, name)
	m.fence(p) // seqs given up while the pair had no path (a rebind) now have one
}

func (m *peerMachine) connectedLegacy(now time.Time, ne *nameEntry, ce *chanEntry, res hsResult, closeCh func(error)) {
	if !res.ctrl || ce == nil {
		closeCh(ErrNoCtrlChannel)
		if !m.cfg.fallback && m.cfg.channels {
			// Fallback off: nothing goes over OOB, whatever the reply says; the channel is
			// asked for again after the backoff.
			msg := "the peer (a Mooncake engine) serves no ctrl channel, and OOB fallback is off"
			if res.noCtrlMsg != "" {
				msg += ": " + res.noCtrlMsg
			}
			err := sendErr(ErrNoCtrlChannel, ne.name, "handshake", errors.New(msg), false)
			m.handshakeFailed(now, ne, err)
			m.failName(now, ne, err)
			return
		}
		// A Mooncake engine without ctrl channel: seq-less OOB at once, no handshake per notify.
		m.handshakeOK(ne)
		m.legacyOOB(now, ne, now.Add(m.cfg.noCtrlRetry))
		return
	}
	m.handshakeOK(ne)
	key := peerKey{legacy: ne.name}
	p := m.peers[key]
	if p == nil {
		if len(m.peers) >= m.cfg.maxPeers {
			closeCh(ErrLimit)
			m.failName(now, ne, sendErr(ErrLimit, ne.name, "handshake", fmt.Errorf("max_peers: %d", m.cfg.maxPeers), false))
			return
		}
		p = m.newPeer(now, key)
		p.names = append(p.names, ne.name)
		p.adv = ne.name
	}
	ne.peer = p
	ce.peer, ce.legacy = p, true
	m.adopt(now, p, ce)
	m.moveWaiters(ne, p)
	m.flush(now, p, ne.name)
}

// legacyOOB serves the Mooncake engine at ne seq-less over OOB until until, its waiting
// sends first.
func (m *peerMachine) legacyOOB(now time.Time, ne *nameEntry, until time.Time) {
	ne.legacyOOB = true
	ne.retryAt = until
	ws := ne.waiters
	ne.waiters = nil
	for _, id := range ws {
		if r := m.reqs[id]; r != nil {
			r.legacy, r.oob = true, true
			m.emit(mAction{kind: aOOB, req: id, name: ne.name, legacy: true, deadline: r.deadline})
		}
	}
}

// busyRetryAfter is the least pause before a handshake refused "busy" is tried again (a
// random part as long again spreads a storm's retries).
const busyRetryAfter = 100 * time.Millisecond

var errSuperseded = errors.New("notify: channel superseded by a newer one of the same pair")

func (m *peerMachine) moveWaiters(ne *nameEntry, p *peerEntry) {
	if ne.stragglers > 0 {
		return // releaseStragglers moves them once the stragglers are answered
	}
	sorted := slices.IsSorted(p.waiters)
	m.handOver(ne.waiters, p)
	if sorted {
		slices.Sort(p.waiters) // send order across the name's and the peer's waiters
	}
	ne.waiters = nil
}

// handOver makes the sends ids (those still known) wait for p, after its own waiters.
func (m *peerMachine) handOver(ids []reqID, p *peerEntry) {
	for _, id := range ids {
		if r := m.reqs[id]; r != nil {
			r.peer = p
			p.waiters = append(p.waiters, id)
		}
	}
}

// bind makes name an alias of the peer with session (created when new).
func (m *peerMachine) bind(now time.Time, ne *nameEntry, session uint64, advertised string, fresh bool) (*peerEntry, error) {
	key := peerKey{session: session}
	p := m.peers[key]
	if p != nil && fresh && p.hasState() && (ne.kept || p.forgotten) {
		// Our state predates this handshake (not a simultaneous open's), and the peer has
		// none: it forgot the pair.
		p = m.restartPair(now, p)
	}
	if p == nil {
		if err := m.roomForPeer(netip.Addr{}); err != nil {
			return nil, sendErr(ErrLimit, ne.name, "handshake", err, false)
		}
		p = m.newPeer(now, key)
		p.bornActive = true
		if advertised != "" {
			p.names = append(p.names, advertised)
		}
	}
	if advertised != "" {
		p.adv = advertised
	}
	if old := ne.peer; old != nil && old != p {
		// The name now reaches another engine (it restarted on the same address): what
		// waited for the old one goes to the new one, with new seqs.
		m.unalias(old, ne.name)
		m.handOver(old.waiters, p)
		old.waiters = nil
	}
	ne.peer = p
	m.confirmPeer(p) // it answered our handshake
	m.markStragglers(ne, p)
	m.alias(p, ne.name)
	return p, nil
}

// hasState reports whether the pair has moved past its start: seqs drawn, or notifies
// received.
func (p *peerEntry) hasState() bool {
	return p.seqs.next > 1 || p.win.next > 1 || p.win.held > 0
}

// restartPair: the peer made its state for old's session just now (it forgot an idle
// pair that we kept), so its seqs toward us and its window for ours start at 1. Ours do
// too, in a new entry: what old's window holds is delivered (it was acknowledged), its
// names and waiting sends move over, its channel is closed, and its sends on their way
// become stragglers of their names (sent again in the new pair, in send order). Returns
// the new entry.
func (m *peerMachine) restartPair(now time.Time, old *peerEntry) *peerEntry {
	m.stats.PairsRestarted++
	m.flushWindow(old)
	p := m.newPeer(now, old.key) // replaces old in m.peers
	m.uncount(old)
	old.confirmed = true // out of the counts for good
	m.confirmPeer(p)
	p.bornActive, p.adv, p.mode = true, old.adv, old.mode
	for _, n := range old.names {
		if ne := m.names[n]; ne != nil && ne.peer == old {
			ne.peer = p
			m.alias(p, n)
		}
	}
	old.names = nil
	m.handOver(old.waiters, p)
	old.waiters = nil
	if ce := m.chans[old.ch]; old.ch != 0 && ce != nil {
		m.dropChan(ce, false)
		m.emit(mAction{kind: aClose, ch: ce.id, err: errSuperseded})
	}
	old.tokenOut = 0
	for _, n := range p.names {
		if ne := m.names[n]; ne != nil {
			m.markStragglers(ne, p)
		}
	}
	return p
}

// markStragglers: ne now leads to p (nil: to no peer, a rebind). Its sends still on their
// way to another pair (the engine that was there before) are stragglers: refused by the new
// engine in any order, they are sent again in the new pair; the name's other sends wait for
// them in ne.waiters, so that the new seqs are drawn in send order (releaseStragglers).
func (m *peerMachine) markStragglers(ne *nameEntry, p *peerEntry) {
	for _, r := range m.reqs {
		if r.name == ne.name && r.peer != nil && r.peer != p && !r.legacy && (r.oob || r.ch != 0) && !r.straggler {
			r.straggler = true
			ne.stragglers++
		}
	}
	if ne.stragglers == 0 || p == nil {
		return
	}
	// Sends of the name already queued on p wait too.
	for _, id := range p.waiters {
		if r := m.reqs[id]; r != nil && r.name == ne.name {
			r.peer = nil
			ne.waiters = append(ne.waiters, id)
		}
	}
	p.waiters = slices.DeleteFunc(p.waiters, func(id reqID) bool { r := m.reqs[id]; return r == nil || r.peer == nil })
	slices.Sort(ne.waiters)
}

const maxAliases = 8

func (m *peerMachine) alias(p *peerEntry, name string) {
	for _, n := range p.names {
		if n == name {
			return
		}
	}
	if len(p.names) >= maxAliases {
		old := p.names[1]
		p.names = append(p.names[:1], p.names[2:]...)
		if ne := m.names[old]; ne != nil && ne.peer == p && len(ne.waiters) == 0 && !ne.connecting {
			delete(m.names, old)
		}
	}
	p.names = append(p.names, name)
}

func (m *peerMachine) unalias(p *peerEntry, name string) {
	for i, n := range p.names {
		if n == name {
			p.names = append(p.names[:i:i], p.names[i+1:]...)
			return
		}
	}
}

func (m *peerMachine) newPeer(now time.Time, key peerKey) *peerEntry {
	p := &peerEntry{key: key, seqs: newSeqSpace(m.cfg.window), win: newRecvWindow(m.cfg.window, m.cfg.idCap), lastActive: now, born: now}
	if !m.cfg.channels {
		p.mode = modeOOB
	}
	m.peers[key] = p
	m.unconfirmedPeers++
	m.armPrune(now)
	return p
}

// unconfirmedPerAddr is how many unconfirmed peer entries the handshakes of one address
// may hold: a quarter of max_peers.
func (m *peerMachine) unconfirmedPerAddr() int { return max(1, m.cfg.maxPeers/4) }

// setFrom records where the handshake that made p came from.
func (m *peerMachine) setFrom(p *peerEntry, from netip.Addr) {
	if p.confirmed || !from.IsValid() || p.from.IsValid() {
		return
	}
	p.from = from
	m.unconfirmedBy[from]++
}

// confirmPeer marks p as proven to be its peer's (peerEntry.confirmed).
func (m *peerMachine) confirmPeer(p *peerEntry) {
	if p.confirmed {
		return
	}
	m.uncount(p)
	p.confirmed = true
}

// uncount takes an unconfirmed p out of the unconfirmed counts.
func (m *peerMachine) uncount(p *peerEntry) {
	if p.confirmed {
		return
	}
	m.unconfirmedPeers--
	if p.from.IsValid() {
		if m.unconfirmedBy[p.from]--; m.unconfirmedBy[p.from] <= 0 {
			delete(m.unconfirmedBy, p.from)
		}
	}
}

// evictable reports whether p may be forgotten to make room: unconfirmed, and holding
// nothing (no channel, send, seq or held notify).
func (m *peerMachine) evictable(p *peerEntry) bool {
	return !p.confirmed && p.ch == 0 && len(p.waiters) == 0 && p.inflight == 0 && p.oldInflight == 0 &&
		p.win.held == 0 && p.seqs.unresolved() == 0 && !m.connectingTo(p)
}

// evictOldest forgets the oldest evictable entry (made by a handshake from "from" when it
// is valid) and reports whether there was one.
func (m *peerMachine) evictOldest(from netip.Addr) bool {
	var old *peerEntry
	for _, p := range m.peers {
		if (from.IsValid() && p.from != from) || !m.evictable(p) {
			continue
		}
		if old == nil || p.born.Before(old.born) {
			old = p
		}
	}
	if old == nil {
		return false
	}
	m.forget(old.key, old)
	m.stats.PeersEvicted++
	return true
}

// roomForPeer makes room for a new peer entry (from: the handshake's address, when it is a
// peer's handshake): an address at its share of unconfirmed entries gives up its oldest,
// and a full table its oldest unconfirmed one. A non-nil error refuses the entry.
func (m *peerMachine) roomForPeer(from netip.Addr) error {
	if from.IsValid() && m.unconfirmedBy[from] >= m.unconfirmedPerAddr() && !m.evictOldest(from) {
		m.stats.PeersRefused++
		return fmt.Errorf("%w: max_peers: %d unconfirmed peer entries from %s, the share of one address", ErrLimit, m.unconfirmedBy[from], from)
	}
	if len(m.peers) >= m.cfg.maxPeers && !m.evictOldest(netip.Addr{}) {
		m.stats.PeersRefused++
		return fmt.Errorf("%w: max_peers: %d peers known, the limit", ErrLimit, m.cfg.maxPeers)
	}
	return nil
}

// openRace reports whether a handshake without proof for a known session is the other half
// of a simultaneous open: its sender could not know our session when it sent, we learned
// its session from our own handshake moments ago, and nothing came from it since. That is
// the one window in which a third party claiming the session is accepted without proof.
func (m *peerMachine) openRace(now time.Time, p *peerEntry, hs inboundHS) bool {
	return hs.proof == 0 && p.bornActive && p.received == 0 && now.Sub(p.born) < m.cfg.connectTimeout
}

func (m *peerMachine) addTokenIn(p *peerEntry, t uint64) {
	if t == 0 || p.tokenIn[0] == t || p.tokenIn[1] == t {
		return
	}
	p.tokenIn[1], p.tokenIn[0] = p.tokenIn[0], t
}

func (m *peerMachine) tokenOK(p *peerEntry, t uint64) bool {
	return t != 0 && (p.tokenIn[0] == t || p.tokenIn[1] == t)
}

// failName fails the sends waiting on ne; a name that leads nowhere is forgotten.
func (m *peerMachine) failName(now time.Time, ne *nameEntry, err error) {
	ws := ne.waiters
	ne.waiters = nil
	for _, id := range ws {
		m.complete(id, err)
	}
	if p := ne.peer; p != nil {
		p.lastErr = err
		if p.ch == 0 {
			m.failPeerWaiters(now, p, err)
		}
		return
	}
	m.dropName(ne)
}

func (m *peerMachine) dropName(ne *nameEntry) {
	if ne.peer == nil && !ne.connecting && len(ne.waiters) == 0 && !ne.legacyOOB && ne.failures == 0 {
		delete(m.names, ne.name)
	}
}

// failPeerWaiters fails or falls back what waits on p when no channel can carry it.
func (m *peerMachine) failPeerWaiters(now time.Time, p *peerEntry, err error) {
	ws := p.waiters
	p.waiters = nil
	for _, id := range ws {
		r := m.reqs[id]
		if r == nil {
			continue
		}
		if m.cfg.fallback && (p.tokenOut != 0 || p.key.legacy != "") && r.seq == 0 && !p.seqs.full() {
			m.sendOOB(p, r, true)
			continue
		}
		if r.seq != 0 {
			p.seqs.giveUp(r.seq)
		}
		m.complete(id, err)
	}
	m.fence(p)
}

// ---- channels ----

// wins reports whether channel a beats channel b of the same pair.
func wins(a, b *chanEntry) bool {
	if a.epoch != b.epoch {
		return a.epoch > b.epoch
	}
	return a.initiator > b.initiator
}

// adopt makes ce p's channel; a channel it replaces is drained and closed.
func (m *peerMachine) adopt(now time.Time, p *peerEntry, ce *chanEntry) {
	if p.ch != 0 && p.ch != ce.id {
		if old := m.chans[p.ch]; old != nil {
			for _, r := range m.reqs {
				if r.ch == old.id {
					p.oldInflight++
				}
			}
			m.dropChan(old, false)
			m.emit(mAction{kind: aClose, ch: old.id, err: errSuperseded})
		}
	}
	ce.up = true
	p.ch = ce.id
	p.mode = modeChannel
	p.epoch = max(p.epoch, ce.epoch)
	p.awaiting = time.Time{}
	p.retryAt = time.Time{}
	p.lastErr = nil
	p.lastActive = now
	m.fence(p)
}

// dropChan takes ce out of service. A channel that carried traffic stays known (forget
// false) until the driver reports it closed, so what its drain delivers still finds its
// peer.
func (m *peerMachine) dropChan(ce *chanEntry, forget bool) {
	if !ce.dropped {
		ce.dropped = true
		m.channels--
		if ce.inbound && !ce.confirmed {
			m.unconfirmed--
		}
		if p := ce.peer; p != nil && p.ch == ce.id {
			p.ch = 0
		}
	}
	ce.up = false
	if forget {
		if p := ce.peer; p != nil {
			for _, f := range ce.fences {
				p.seqs.refence(f.r)
			}
		}
		ce.fences = nil
		delete(m.chans, ce.id)
	}
}

// chanClosed: channel ch ended (an error, the peer's goodbye, our close). Its pending
// sends were reported through sendResult before.
func (m *peerMachine) chanClosed(now time.Time, ch chanID, err error) {
	ce := m.chans[ch]
	if ce == nil {
		return
	}
	p := ce.peer
	m.dropChan(ce, true)
	if p != nil {
		m.fence(p)
	}
	if p != nil && p.ch == 0 {
		p.lastErr = err
		if len(p.waiters) > 0 {
			m.flush(now, p, "")
		}
	}
}

// inboundHS is a peer's handshake request.
type inboundHS struct {
	name    string // the name it advertised
	session uint64 // 0: a Mooncake peer
	token   uint64 // the token it issues us
	proof   uint64 // the token we issued it before (0: none)
	epoch   uint64
	ctrl    bool // it offers a ctrl channel
	// maxNotify: its max_notify_size (ts_max_notify; 0: not said)
	maxNotify int
	from      netip.Addr // where the handshake came from (zero: unknown)
}

// inboundReply is the machine's answer to a handshake request.
type inboundReply struct {
	refuse string
	err    error
	ch     chanID // accept with a channel: the driver creates and connects it, then calls inboundUp
	token  uint64 // the token we issue the peer
	epoch  uint64
	fresh  bool // the entry was made by this handshake (ts_fresh)
}

// inbound decides a peer's handshake request.
func (m *peerMachine) inbound(now time.Time, hs inboundHS) inboundReply {
	if hs.session == 0 {
		return m.inboundLegacy(now, hs)
	}
	key := peerKey{session: hs.session}
	p := m.peers[key]
	proven := p != nil && m.tokenOK(p, hs.proof) // a pair we know, proving its token
	if p != nil && p.tokenIn[0] != 0 && !proven && !m.openRace(now, p, hs) {
		m.stats.AuthRefused++
		return inboundReply{refuse: refuseAuth, err: fmt.Errorf("%w: ts_proof: session %x is known here and the proof does not match", ErrAuth, hs.session)}
	}
	if hs.ctrl && m.cfg.channels && !proven && m.unconfirmed >= m.cfg.maxUnconfirmed {
		// A flood of handshakes whose channels nobody uses: refuse until they expire,
		// keeping nothing; a real peer retries (or is served over OOB meanwhile).
		m.stats.UnconfirmedRefused++
		return inboundReply{refuse: refuseBusy, err: fmt.Errorf("%w: %d channels handshaken and not yet used by their peers", ErrBackpressure, m.unconfirmed)}
	}
	fresh := false // the entry is made here: our state for the pair starts at 1
	if p == nil {
		if err := m.roomForPeer(hs.from); err != nil {
			return inboundReply{refuse: refuseLimit, err: err}
		}
		if hs.ctrl && m.cfg.channels && m.channels >= m.cfg.maxChannels {
			// Refused, and nothing kept: the token is a cookie; a peer that uses it over OOB
			// gets its entry then (oobArrive).
			m.stats.ChannelsRefused++
			return inboundReply{refuse: refuseLimit, token: m.cookie(hs.session, hs.name),
				err: fmt.Errorf("%w: max_channels: %d channels open, the limit", ErrLimit, m.cfg.maxChannels)}
		}
		p = m.newPeer(now, key)
		m.setFrom(p, hs.from)
		fresh = true
		if hs.name != "" {
			p.names = append(p.names, hs.name)
		}
	}
	p.lastActive = now
	p.tokenOut = hs.token
	p.fenceAt = time.Time{} // a new token: refused fences may pass now
	if hs.maxNotify > 0 {
		p.maxNotify = hs.maxNotify
	}
	if hs.name != "" {
		p.adv = hs.name
	}
	m.fence(p) // seqs given up while the pair had no path (a rebind) now have one
	if p.tokenIn[0] == 0 {
		m.addTokenIn(p, m.rand())
	}
	if hs.name != "" {
		m.learnName(now, p, hs.name)
	}
	rep := inboundReply{token: p.tokenIn[0], epoch: p.epoch, fresh: fresh}
	if !m.cfg.channels || !hs.ctrl || hs.session == m.local {
		// A session without channel: the pair talks over OOB with seqs. So does this
		// engine with itself (a name of its own): both ends of one QP would be one peer's
		// two channels, and each would supersede the other.
		if p.ch == 0 {
			p.mode = modeOOB
		}
		if !m.cfg.channels {
			rep.refuse = refuseNoCtrl
		}
		m.flush(now, p, "")
		return rep
	}
	epoch := hs.epoch
	if epoch == 0 {
		epoch = p.epoch + 1
	}
	cand := &chanEntry{epoch: epoch, initiator: hs.session, peer: p}
	if p.ch != 0 {
		if cur := m.chans[p.ch]; cur != nil && !wins(cand, cur) {
			m.stats.Superseded++
			rep.refuse = refuseSuperseded
			return rep
		}
	}
	for _, ce := range m.chans {
		if ce.peer == p && !ce.up && !ce.dropped && !wins(cand, ce) {
			// Our own handshake to it is in flight and will win on both sides.
			m.stats.Superseded++
			rep.refuse = refuseSuperseded
			return rep
		}
	}
	if p.ch == 0 && m.channels >= m.cfg.maxChannels {
		m.stats.ChannelsRefused++
		rep.refuse = refuseLimit
		rep.err = fmt.Errorf("%w: max_channels: %d channels open, the limit", ErrLimit, m.cfg.maxChannels)
		return rep
	}
	m.nextChan++
	m.channels++
	cand.id = m.nextChan
	if proven {
		cand.inbound, cand.confirmed = true, true // its peer proved the pair: a real QP
	} else {
		m.addUnconfirmed(now, cand)
	}
	m.chans[cand.id] = cand
	rep.ch = cand.id
	rep.epoch = epoch
	return rep
}

func (m *peerMachine) addUnconfirmed(now time.Time, ce *chanEntry) {
	ce.inbound, ce.born = true, now
	m.unconfirmed++
	m.setTimer(now.Add(m.cfg.connectTimeout))
}

// confirm marks ce used by its peer.
func (m *peerMachine) confirm(ce *chanEntry) {
	if ce.peer != nil {
		m.confirmPeer(ce.peer) // it used the channel
	}
	if ce.inbound && !ce.confirmed {
		ce.confirmed = true
		if !ce.dropped {
			m.unconfirmed--
		}
	}
}

// learnName makes the advertised name an alias of p, taking over sends waiting on it.
func (m *peerMachine) learnName(now time.Time, p *peerEntry, name string) {
	ne := m.names[name]
	if ne == nil {
		if len(m.names) >= m.cfg.maxNames {
			return
		}
		ne = &nameEntry{name: name, lastUsed: now}
		m.names[name] = ne
	}
	if ne.peer != p {
		if ne.peer != nil {
			m.unalias(ne.peer, name)
		}
		ne.peer = p
	}
	if ne.connecting {
		// Our own handshake to this name is on its way with ne.token: the peer may use it
		// before our reply arrives (a simultaneous open).
		m.addTokenIn(p, ne.token)
	}
	m.alias(p, name)
	m.moveWaiters(ne, p) // in their order, ahead of any later send to the name
}

func (m *peerMachine) inboundLegacy(now time.Time, hs inboundHS) inboundReply {
	if hs.name == "" {
		return inboundReply{refuse: refuseInvalid, err: fmt.Errorf("%w: local_nic_path: empty, no peer name", ErrInvalid)}
	}
	if !m.cfg.channels || !hs.ctrl {
		return inboundReply{refuse: refuseNoCtrl, err: fmt.Errorf("%w: this engine has no ctrl channel", ErrNoCtrlChannel)}
	}
	if m.unconfirmed >= m.cfg.maxUnconfirmed {
		m.stats.UnconfirmedRefused++
		return inboundReply{refuse: refuseBusy, err: fmt.Errorf("%w: %d channels handshaken and not yet used by their peers", ErrBackpressure, m.unconfirmed)}
	}
	key := peerKey{legacy: hs.name}
	p := m.peers[key]
	fresh := false
	if p == nil {
		if m.channels >= m.cfg.maxChannels {
			m.stats.ChannelsRefused++
			return inboundReply{refuse: refuseLimit, err: fmt.Errorf("%w: max_channels: %d channels open, the limit", ErrLimit, m.cfg.maxChannels)}
		}
		if err := m.roomForPeer(hs.from); err != nil {
			return inboundReply{refuse: refuseLimit, err: err}
		}
		p = m.newPeer(now, key)
		m.setFrom(p, hs.from)
		fresh = true
		p.names = append(p.names, hs.name)
		p.adv = hs.name
		if ne := m.names[hs.name]; ne == nil && len(m.names) < m.cfg.maxNames {
			m.names[hs.name] = &nameEntry{name: hs.name, peer: p, lastUsed: now}
		} else if ne != nil && ne.peer == nil {
			ne.peer = p
			if !ne.connecting {
				m.moveWaiters(ne, p)
			}
		}
	} else if p.ch == 0 && m.channels >= m.cfg.maxChannels {
		m.stats.ChannelsRefused++
		return inboundReply{refuse: refuseLimit, err: fmt.Errorf("%w: max_channels: %d channels open, the limit", ErrLimit, m.cfg.maxChannels)}
	}
	// A Mooncake peer's latest channel is the one it uses.
	p.epoch++
	m.nextChan++
	m.channels++
	ce := &chanEntry{id: m.nextChan, epoch: p.epoch, initiator: 0, peer: p, legacy: true}
	m.addUnconfirmed(now, ce)
	m.chans[ce.id] = ce
	return inboundReply{ch: ce.id, epoch: p.epoch, fresh: fresh}
}

// inboundUp: the channel of an accepted handshake is connected (err nil) or could not be
// (err: it is forgotten, and the reply carries the error).
func (m *peerMachine) inboundUp(now time.Time, ch chanID, err error) {
	ce := m.chans[ch]
	if ce == nil {
		return
	}
	if err != nil {
		m.dropChan(ce, true)
		return
	}
	p := ce.peer
	if p.ch != 0 && p.ch != ch {
		if cur := m.chans[p.ch]; cur != nil && !ce.legacy && !wins(ce, cur) {
			m.dropChan(ce, false)
			m.emit(mAction{kind: aClose, ch: ch, err: errSuperseded})
			return
		}
	}
	m.adopt(now, p, ce)
	m.flush(now, p, "")
}

// inboundFailed: our side of the channel a peer's handshake asked for could not be made
// (a QP, a CQ, an fd, a verbs call). The channel goes; an entry this handshake made (fresh)
// goes too, so a failing handshake leaves nothing behind, and the peer gets a cookie
// (as for max_channels): its first OOB notify with it makes the entry (oobArrive). An entry
// that existed keeps its token. It returns the token for the refusal.
func (m *peerMachine) inboundFailed(now time.Time, ch chanID, fresh bool, hs inboundHS) uint64 {
	ce := m.chans[ch]
	if ce == nil {
		return 0
	}
	p := ce.peer
	m.dropChan(ce, true)
	if p == nil {
		return 0
	}
	if fresh && !p.hasState() && len(p.waiters) == 0 && p.inflight == 0 && !m.connectingTo(p) {
		m.forget(p.key, p)
		return m.cookie(hs.session, hs.name)
	}
	return p.tokenIn[0]
}

// ---- receiving ----

// chanArrival is a notify that came on channel ch.
func (m *peerMachine) chanArrival(now time.Time, ch chanID, seq uint64, nid string, n Notify) {
	ce := m.chans[ch]
	if ce == nil || ce.peer == nil {
		return // a channel being closed: its drain is delivered by the channel's own entry
	}
	p := ce.peer
	p.lastActive = now
	m.confirm(ce)
	n.Peer = m.peerName(p)
	if ce.legacy || seq == 0 {
		m.stats.LegacyDelivered++
		p.received++
		m.emit(mAction{kind: aDeliver, n: n})
		return
	}
	if m.arrive(now, p, seq, nid, n) == arrDuplicate && p.win.takeGaveUp(seq) {
		// It came after its gap was given up, and its sender's SEND completed: it is
		// delivered, late and out of order, rather than lost (counted: Window.Late).
		p.received++
		m.emit(mAction{kind: aDeliver, n: n})
	}
}

func (m *peerMachine) arrive(now time.Time, p *peerEntry, seq uint64, nid string, n Notify) arrival {
	res := p.win.arrive(now, seq, nid, n, func(d Notify) {
		p.received++
		m.emit(mAction{kind: aDeliver, n: d})
	})
	m.heldDups(p)
	switch res {
	case arrDuplicate:
		p.dups++
		m.stats.Duplicates++
	case arrHeld:
		m.setTimer(p.win.gapDeadline(m.cfg.gapTimeout))
	}
	return res
}

// heldDups counts, as duplicates, the held notifies p's window dropped at release because
// another copy with the same id went first.
func (m *peerMachine) heldDups(p *peerEntry) {
	if d := p.win.takeHeldDupIDs(); d > 0 {
		p.dups += d
		m.stats.Duplicates += d
	}
}

// chanFence: the peer gave up [first, first+count) (a FENCE on channel ch).
func (m *peerMachine) chanFence(now time.Time, ch chanID, first, count uint64) {
	ce := m.chans[ch]
	if ce == nil || ce.peer == nil || ce.legacy {
		return
	}
	m.confirm(ce)
	m.skip(now, ce.peer, first, count)
}

func (m *peerMachine) skip(now time.Time, p *peerEntry, first, count uint64) {
	p.win.skip(now, first, count, func(d Notify) {
		p.received++
		m.emit(mAction{kind: aDeliver, n: d})
	})
	m.heldDups(p)
}

// oobArrival is a notify (or a fence) that came over OOB.
type oobArrival struct {
	session, token, to, seq, skipFrom, skipN uint64
	nid                                      string
	from                                     string
	n                                        Notify
}

// oobArrive decides an OOB notify: "" accepted (delivered, held, or a duplicate already
// delivered), else a refusal code for the reply.
func (m *peerMachine) oobArrive(now time.Time, a oobArrival) (string, error) {
	if a.session == 0 {
		// A Mooncake engine: no session, no seq; delivered as it comes.
		m.stats.LegacyDelivered++
		a.n.Peer = a.from
		m.emit(mAction{kind: aDeliver, n: a.n})
		return "", nil
	}
	if a.to != 0 && a.to != m.local {
		// The sender's pair is with this engine's predecessor: it must handshake again.
		m.stats.OOBRefused++
		return refuseAuth, fmt.Errorf("%w: ts_to: %x is not this engine's session (it restarted)", ErrAuth, a.to)
	}
	p := m.peers[peerKey{session: a.session}]
	if p == nil || !m.tokenOK(p, a.token) {
		var code string
		var err error
		if p, code, err = m.provenByToken(now, p, &a); code != "" {
			return code, err
		}
	}
	if p == nil || !m.tokenOK(p, a.token) {
		m.stats.OOBRefused++
		m.stats.AuthRefused++
		return refuseAuth, fmt.Errorf("%w: ts_token: no handshake of session %x with this engine issued it", ErrAuth, a.session)
	}
	p.lastActive = now
	m.confirmPeer(p) // it used the pair's token
	if a.skipN > 0 {
		m.skip(now, p, a.skipFrom, a.skipN)
	}
	if a.seq == 0 {
		return "", nil
	}
	a.n.Peer = m.peerName(p)
	switch m.arrive(now, p, a.seq, a.nid, a.n) {
	case arrRefused:
		m.stats.OOBRefused++
		return refuseBusy, fmt.Errorf("%w: ts_seq %d is beyond the receive window", ErrBackpressure, a.seq)
	case arrDuplicate:
		if p.win.gaveUp(a.seq) {
			// Its gap timed out before it came: it was not delivered, and never will be.
			m.stats.OOBRefused++
			return refuseStale, fmt.Errorf("%w: ts_seq %d came after its gap was given up", ErrRejected, a.seq)
		}
	}
	return "", nil
}

// provenByToken applies the two proofs an OOB notify's token can carry for a pair this
// engine does not hold, or not with that token: the cookie of a max_channels refusal
// (inbound), or the token of our own handshake still in flight (offer: the sender answered
// it, nobody else has seen it, and it sends before its reply reached us). The latter opens
// only a session we do not know yet or the one its name already leads to, so the engine at
// that name cannot speak for another peer's session. It returns p, or the entry it made;
// a non-empty code refuses the notify (max_peers).
func (m *peerMachine) provenByToken(now time.Time, p *peerEntry, a *oobArrival) (*peerEntry, string, error) {
	if a.token == 0 {
		return p, "", nil
	}
	cookie := p == nil && a.token == m.cookie(a.session, a.from)
	name, offered := m.offered[a.token]
	offered = offered && (p == nil || p.adv == name || slices.Contains(p.names, name))
	if !cookie && !offered {
		return p, "", nil
	}
	if p == nil {
		if err := m.roomForPeer(netip.Addr{}); err != nil {
			m.stats.OOBRefused++
			return nil, refuseLimit, err
		}
		p = m.newPeer(now, peerKey{session: a.session})
	}
	m.addTokenIn(p, a.token)
	if cookie {
		// Refused a channel: served over OOB, under the name it handshook with.
		p.mode = modeOOB
		if name = a.from; name != "" {
			p.names = append(p.names, name)
			p.adv = name
		}
	}
	if name != "" {
		m.learnName(now, p, name)
	}
	return p, "", nil
}

// ---- time ----

func (m *peerMachine) setTimer(at time.Time) {
	if at.IsZero() {
		return
	}
	if m.timerAt.IsZero() || at.Before(m.timerAt) {
		m.timerAt = at
		m.emit(mAction{kind: aTimer, at: at})
	}
}

func (m *peerMachine) armPrune(now time.Time) { m.setTimer(now.Add(m.cfg.peerIdle)) }

// tick runs what is due at now: receive gaps that timed out, peers that yielded and never
// connected, backoffs that ended, idle peers to forget.
func (m *peerMachine) tick(now time.Time) {
	m.timerAt = time.Time{}
	var next time.Time
	later := func(t time.Time) {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	for key, p := range m.peers {
		if p.win.held > 0 {
			p.win.expire(now, m.cfg.gapTimeout, func(d Notify) {
				p.received++
				m.emit(mAction{kind: aDeliver, n: d})
			})
			m.heldDups(p)
			later(p.win.gapDeadline(m.cfg.gapTimeout))
		}
		if !p.awaiting.IsZero() {
			if !now.Before(p.awaiting) {
				p.awaiting = time.Time{}
				switch {
				case p.ch == 0 && p.tokenOut == 0 && p.mode == modeChannel && len(p.waiters) > 0 && errors.Is(p.lastErr, ErrAuth):
					// The handshake we waited for never came: the refusal stands.
					m.failPeerWaiters(now, p, p.lastErr)
				case p.ch == 0 && len(p.waiters) > 0:
					p.epoch++ // outbid whatever the peer meant to send
					m.flush(now, p, "")
				}
			} else {
				later(p.awaiting)
			}
		}
		if !p.fenceAt.IsZero() {
			if !now.Before(p.fenceAt) {
				p.fenceAt = time.Time{}
				m.fence(p)
			} else {
				later(p.fenceAt)
			}
		}
		if !p.retryAt.IsZero() {
			if !now.Before(p.retryAt) {
				p.retryAt = time.Time{}
				if p.mode == modeOOB && m.cfg.channels {
					p.mode = modeChannel
				}
			} else {
				later(p.retryAt)
			}
		}
		if len(p.waiters) > 0 && p.ch == 0 && p.awaiting.IsZero() && !m.connectingTo(p) {
			m.flush(now, p, "") // nothing is on its way for them: start a path
		}
		if p.ch == 0 && len(p.waiters) == 0 && p.inflight == 0 && p.win.held == 0 && p.seqs.unresolved() == 0 &&
			!m.connectingTo(p) && now.Sub(p.lastActive) >= m.cfg.peerIdle {
			m.forget(key, p)
			m.stats.PeersPruned++
			continue
		}
		if p.ch == 0 {
			later(p.lastActive.Add(m.cfg.peerIdle))
		}
	}
	for _, ce := range m.chans {
		if !ce.inbound || ce.confirmed || ce.dropped {
			continue
		}
		if exp := ce.born.Add(m.cfg.connectTimeout); now.Before(exp) {
			later(exp)
			continue
		}
		m.stats.UnconfirmedExpired++
		m.dropChan(ce, false)
		m.emit(mAction{kind: aClose, ch: ce.id, err: fmt.Errorf("%w: the peer never used the channel its handshake made", ErrPeerDead)})
		if p := ce.peer; p != nil && p.ch == 0 {
			// Its peer was visited above while the channel still stood: its idle prune
			// is due from now on (else an entry the initiator forgot outlives it, and
			// that initiator's next handshakes are refused for want of a proof).
			later(p.lastActive.Add(m.cfg.peerIdle))
		}
	}
	for id, r := range m.reqs {
		if r.ch != 0 || r.oob {
			continue // on its way: its path's own bound ends it
		}
		if !now.Before(r.deadline) {
			m.cancel(id, errors.New("deadline passed while waiting for a path"))
			continue
		}
		later(r.deadline)
	}
	for _, ne := range m.names {
		if ne.peer == nil && !ne.connecting && len(ne.waiters) > 0 && ne.failures > 0 && ne.stragglers == 0 {
			if now.Before(ne.backoffAt) {
				later(ne.backoffAt)
			} else {
				m.connectName(now, ne, nil) // the backoff is over: what waited goes
			}
			continue
		}
		if ne.peer == nil && !ne.connecting && len(ne.waiters) == 0 && ne.stragglers == 0 && (ne.retryAt.IsZero() || !now.Before(ne.retryAt)) {
			if now.Before(ne.backoffAt) {
				later(ne.backoffAt) // its backoff outlives the entry's use
				continue
			}
			delete(m.names, ne.name)
		}
	}
	m.releaseStragglers(now)
	m.setTimer(next)
}

func (m *peerMachine) anyConnecting() bool {
	for _, ne := range m.names {
		if ne.connecting {
			return true
		}
	}
	return false
}

func (m *peerMachine) connectingTo(p *peerEntry) bool {
	for _, n := range p.names {
		if ne := m.names[n]; ne != nil && ne.connecting {
			return true
		}
	}
	return false
}

// peerGone: the engine behind name closed (its goodbye). Its pair is forgotten when
// nothing of it is in flight.
func (m *peerMachine) peerGone(now time.Time, name string) {
	ne := m.names[name]
	if ne == nil || ne.peer == nil {
		return
	}
	p := ne.peer
	if ce := m.chans[p.ch]; p.ch != 0 && ce != nil {
		// Its channel goes too (drained first: what its NIC acknowledged is delivered).
		m.dropChan(ce, false)
		m.emit(mAction{kind: aClose, ch: ce.id, err: fmt.Errorf("%w: %s closed", ErrPeerDead, name)})
	}
	if len(p.waiters) == 0 && p.inflight == 0 && p.win.held == 0 && p.seqs.unresolved() == 0 && !m.connectingTo(p) {
		m.forget(p.key, p)
		m.stats.PeersPruned++
	}
}

// forget drops a peer entry and its names. Its sequence spaces go with it: a peer that
// comes back handshakes again and starts new ones.
func (m *peerMachine) forget(key peerKey, p *peerEntry) {
	m.uncount(p)
	for _, n := range p.names {
		if ne := m.names[n]; ne != nil && ne.peer == p {
			delete(m.names, n)
		}
	}
	delete(m.peers, key)
}

// statsName names p in Stats: an alias, else its session; a peer whose names went to
// another engine (it restarted on the same address) is not shown under that address.
func (m *peerMachine) statsName(p *peerEntry) string {
	if len(p.names) > 0 || p.key.legacy != "" {
		return m.peerName(p)
	}
	return fmt.Sprintf("session-%x", p.key.session)
}

// peerName is how p is named in notifies and errors: the name it advertised, else the
// first name it was reached by, else the name of its last handshake.
func (m *peerMachine) peerName(p *peerEntry) string {
	if len(p.names) > 0 {
		return p.names[0]
	}
	if p.adv != "" {
		return p.adv
	}
	if p.key.legacy != "" {
		return p.key.legacy
	}
	return fmt.Sprintf("session-%x", p.key.session)
}

// flushWindow delivers what p's window holds, in seq order, and gives its gaps up.
func (m *peerMachine) flushWindow(p *peerEntry) {
	p.win.flush(func(d Notify) {
		p.received++
		m.emit(mAction{kind: aDeliver, n: d})
	})
	m.heldDups(p)
}

// closeAll fails every waiting send and forgets every channel (the engine closes); what
// windows hold is delivered, gaps given up.
func (m *peerMachine) closeAll(err error) {
	for _, p := range m.peers {
		m.flushWindow(p)
	}
	var unknown error // for a send on its way (posted, or written over OOB) or one whose earlier try may have landed
	for id, r := range m.reqs {
		e := err
		if r.ch != 0 || r.oob || r.maybe {
			if unknown == nil {
				unknown = sendErr(ErrClosed, "", "", err, true)
			}
			e = unknown
		}
		m.emit(mAction{kind: aComplete, req: id, err: e})
	}
	clear(m.reqs)
	for id := range m.chans {
		m.emit(mAction{kind: aClose, ch: id, err: err})
	}
	clear(m.chans)
	m.channels, m.unconfirmed, m.connects, m.connectQ = 0, 0, 0, nil
	for _, p := range m.peers {
		p.ch, p.waiters, p.inflight = 0, nil, 0
	}
	m.inflight = 0
}

// peerState names p's state for Stats.
func (m *peerMachine) peerState(p *peerEntry) string {
	switch {
	case p.ch != 0:
		return "up"
	case p.mode == modeOOB:
		return "oob"
	case m.connectingTo(p):
		return "connecting"
	case !p.awaiting.IsZero():
		return "awaiting-peer"
	}
	return "idle"
}
