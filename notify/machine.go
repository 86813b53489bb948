package notify

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"net/netip"
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
//
// The decisions live in one file each: machine_send.go (sends, paths, sizes, results,
// fences), machine_connect.go (our handshakes, their results, the connect backoff),
// machine_order.go (one order per pair whatever the names), machine_inbound.go (peers'
// handshakes and channels), machine_peers.go (the peer table: entries, aliases, tokens,
// room), machine_recv.go (arrivals: channel and OOB notifies, fences) and machine_time.go
// (the timer: deadlines, gaps, retries, prunes). This file has the state and the action
// plumbing.
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
	nextPair    uint64 // peerEntry.pair of the next entry
	inflight    int    // sends posted on channels and not completed, all peers
	channels    int    // channels up or being created
	unconfirmed int    // inbound channels their peer has not used yet
	// Those by pool and source address of their handshake (unusedBy), and by pool in all
	// (unusedIn): each pool is capped per address and in all (roomForUnused), so what
	// unauthenticated handshakes make the NIC hold is bounded.
	unusedBy map[unusedKey]int
	unusedIn [2]int
	// Peer entries made by a peer's handshake and not yet confirmed (see peerEntry.confirmed),
	// in all and per source address: capped, and evicted first when the table is full.
	unconfirmedPeers int
	unconfirmedBy    map[netip.Addr]int
	connects         int      // our handshakes in flight
	connectQ         []string // names waiting for a handshake slot, in order
	// Order across names (machine_order.go): unknown lists names whose sends wait for the
	// name's first handshake (its engine not known yet); held, the peers whose sends wait
	// behind them (heldSpare: held's other buffer).
	unknown         []string
	held, heldSpare []*peerEntry
	// superseded: peers whose engine went away from a name while sends were still with
	// them; later sends to a peer of the same port wait behind those (heldBySuperseded).
	superseded []*peerEntry
	timerAt    time.Time

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
	kept       uint64  // that handshake went while we held state (seqs, a window) for the pair with this session (0: none)
	lost       uint64  // the session whose pair the peer at this name refused (rebind): the next handshake kept its state
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
	// hinted: the name's handshakes failed, and an engine answered on its port since: its
	// next handshake goes at once, and its sends hold later ones to that port's peers
	// (unknownWaits) until it ends, as a new name's do. hintedOut: the hint came while a
	// handshake of the name was out; if that handshake fails too (it went before the
	// engine was up) the name stays hinted, once: its next handshake still goes at once.
	hinted, hintedOut bool
	// unreachable: the name's last handshake failed with no engine's answer (nothing
	// listening, a timeout): until one answers, its sends hold nothing (unknownWaits).
	unreachable bool
	// askedAgain: its last handshake was answered by an engine replaced at its address
	// since (staleAnswer): the name is asked once more, its sends waiting on it.
	askedAgain bool
}

type peerEntry struct {
	// replaced: a name that led to it now leads to another engine (it restarted at that
	// address): an answer from it that was on its way is stale (staleAnswer).
	replaced bool
	key      peerKey
	pair     uint64   // this entry among the session's: an entry that replaced it (restartPair) has another
	names    []string // aliases; names[0] is the name the peer advertised, if any
	adv      string   // the name the peer gave in its last handshake: Notify.Peer when names is empty (a rebind took them)
	mode     peerMode
	ch       chanID // current channel, 0: none
	epoch    uint64 // highest epoch seen for the pair
	awaiting time.Time

	// tokenIn: what the peer may present (ts_token on OOB notifies, ts_proof), newest
	// first; [0] is what we issue now. Several: until the pair settles, each of our
	// handshakes to a name not yet known to lead to it issued its own, and the peer keeps
	// whichever reached it last (a handshake of ours, the reply to its own).
	tokenIn  [4]uint64
	tokenOut uint64 // what we present to it
	// tokenOutSure: the peer holds tokenOut: it came in the peer's reply to a handshake of
	// ours, or in a handshake that proved the pair. One from a handshake without proof is
	// the peer's only once our reply reaches it (that handshake may end without it): it
	// never replaces a sure one.
	tokenOutSure bool
	// proved: the peer has shown it holds a token of ours (a handshake's ts_proof, an OOB
	// notify's ts_token, a frame on the channel our reply described) or answered our own
	// handshake. Until then a handshake of its session without proof is answered again
	// with our token (its earlier reply may have been cut: it cannot know it); after, a
	// handshake must prove the pair.
	proved bool

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
	held       bool // in peerMachine.held: its sends wait behind a name not known yet
	// fenceAt: an OOB fence was refused; no fence goes over OOB before then (tick sends
	// them), so a refusing peer sees one try per fenceWait, not a storm. A channel, or a
	// new token from a handshake, carries them at once.
	fenceAt   time.Time
	fenceWait time.Duration
	// superseded: its engine went away from one of its names (supersede); holdFrom: the
	// oldest send still with it, when known (0: find it again).
	superseded bool
	holdFrom   reqID
	// confirmed: the peer proved the entry is its own: it answered our handshake, used the
	// pair's token or channel, or we sent to it. An entry a handshake made is unconfirmed
	// until then: those are capped per source address and evicted first (oldest first)
	// when the table is full, so a flood of handshakes can neither push out nor lock out
	// peers that talk. from: the address of the handshake that made it (when known).
	confirmed bool
	from      netip.Addr
	// inCh: the last channel a handshake of the peer asked for (inbound), up or being
	// made: an unconfirmed entry is evictable only when that channel is (evictable).
	inCh chanID
	// maxNotify is the largest name+msg the peer delivers (its handshake's ts_max_notify;
	// 0: not said): a larger notify is refused here, before a seq is drawn.
	maxNotify int
	// OOB pacing (machine_busy.go): once the peer answers "busy", at most oobCap of the
	// pair's OOB notifies are on the wire (oobOut); the others wait in parked, in seq order,
	// with their seqs, and go as the peer's answers come. busyAt: nothing is on the wire and
	// the head goes again then (busyWait doubles per busy answer in a row). heldOOB: the
	// peer's OOB notifies this engine holds while its receive queue is full.
	oobOut, oobCap int
	oobGrow        int // answers since the cap last grew
	parked         []reqID
	busyAt         time.Time
	busyWait       time.Duration
	heldOOB        int

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
	// from and pool: an unconfirmed inbound channel's handshake address and pool (counted
	// in peerMachine.unusedBy).
	from netip.Addr
	pool unusedPool
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
	// paced: on the wire over OOB, counted in its peer's oobOut; parked: in its peer's
	// parked, with its seq, not on the wire.
	paced, parked bool
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
	pair     uint64 // aFence: the peerEntry.pair whose seqs it gives up
	legacy   bool
	err      error
	n        Notify
	at       time.Time
	deadline time.Time
}

type machineStats struct {
	Names, Channels, Unconfirmed           int
	UnconfirmedRefused, UnconfirmedExpired uint64
	UnconfirmedEvicted                     uint64
	PeersRefused, NamesRefused, ChannelsRefused, AuthRefused, Superseded, Reposted, Fallbacks, GivenUp,
	FencesSent, FencesDropped, PairsRestarted, LegacyDelivered, OOBRefused, PeersPruned uint64
	PeersEvicted     uint64
	PeersUnconfirmed int
	// HandshakesFailed: our handshakes that failed (each starts or lengthens a backoff);
	// BackoffRefused: sends refused at once while their peer's handshakes backed off.
	HandshakesFailed, BackoffRefused uint64
	Duplicates                       uint64 // received notifies dropped as duplicates (seq or id)
	ConnectsQueued                   uint64 // handshakes that waited for a slot (maxConnects)
	StaleByes                        uint64 // goodbyes of an engine its name no longer led to
	// BusyAnswers: our OOB notifies the peer answered "busy" (each waits in its pair's
	// parked queue); BusyProbes: heads sent again because nothing else was on the wire.
	BusyAnswers, BusyProbes uint64
}

func newPeerMachine(local uint64, cfg machineConfig, rnd func() uint64) *peerMachine {
	cfg.setDefaults()
	m := &peerMachine{
		local: local, cfg: cfg, rand: rnd,
		names: make(map[string]*nameEntry), peers: make(map[peerKey]*peerEntry), unconfirmedBy: make(map[netip.Addr]int),
		unusedBy: make(map[unusedKey]int),
		chans:    make(map[chanID]*chanEntry), reqs: make(map[reqID]*reqEntry),
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
