package soak

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/twosided/twosided/oob"
)

// The hostile client: it runs in the parent, outside every engine, and speaks to one
// engine's OOB port as an attacker would, for the time its fault lasts. It trusts nothing
// it is answered and judges nothing itself: what it forges must never be delivered (a
// forged notify carries a soak name in a live engine's name, so a delivery of it is a
// phantom, a duplicate or a reorder to the checker), and everyone else's notifies must
// keep their contract.

// HostileClassicPrefix starts the names of the hostile client's plain Mooncake notifies
// (no twosided member): the protocol delivers those, and the agents leave them out of the
// history.
const HostileClassicPrefix = "hostile/"

// Bounds of one hostile burst, so that a long run's bursts stay an attack and do not
// become the whole load.
const (
	hostileWorkers   = 4
	hostileMaxFrames = 256 // per worker and burst
	hostileIdleConns = 8   // connections held open saying nothing, per burst
	hostileIOTimeout = 2 * time.Second
)

// Identity is an engine a forged notify claims to come from.
type Identity struct {
	ID   string // its engine id (a soak name's sender)
	Addr string // its OOB address (ts_from)
}

// HostileStats counts what the hostile client sent, by what.
type HostileStats struct {
	Frames, Conns, Refused atomic.Uint64
}

// runHostile attacks target for d (or until ctx ends) as variant says; forgeAs are the live
// engines it may claim to be (forged). r is the fault's own generator.
func runHostile(ctx context.Context, variant, target string, forgeAs []Identity, r *rand.Rand, d time.Duration, st *HostileStats) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	done := make(chan struct{}, hostileWorkers)
	for w := range hostileWorkers {
		wr := rand.New(rand.NewPCG(r.Uint64(), uint64(w)))
		go func() {
			defer func() { done <- struct{}{} }()
			h := &hostileWorker{ctx: ctx, target: target, r: wr, st: st, src: "127.0.0." + strconv.Itoa(2+w)}
			for i := 0; i < hostileMaxFrames && ctx.Err() == nil; i++ {
				switch variant {
				case HostileFlood:
					h.ghostHandshake()
				case HostileForged:
					if len(forgeAs) > 0 {
						h.forged(forgeAs[wr.IntN(len(forgeAs))])
					}
				case HostileGarbage:
					h.garbage(w == 0 && i < hostileIdleConns)
				}
			}
		}()
	}
	for range hostileWorkers {
		<-done
	}
}

type hostileWorker struct {
	ctx    context.Context
	target string
	src    string // the loopback address it connects from
	r      *rand.Rand
	st     *HostileStats
}

func (h *hostileWorker) dial() (net.Conn, error) {
	d := net.Dialer{Timeout: hostileIOTimeout, LocalAddr: &net.TCPAddr{IP: net.ParseIP(h.src)}}
	c, err := d.DialContext(h.ctx, "tcp", h.target)
	if err != nil {
		// Another loopback address may not be routable everywhere: try the plain one.
		c, err = (&net.Dialer{Timeout: hostileIOTimeout}).DialContext(h.ctx, "tcp", h.target)
	}
	if err == nil {
		h.st.Conns.Add(1)
		_ = c.SetDeadline(time.Now().Add(hostileIOTimeout))
	}
	return c, err
}

// exchange sends raw bytes on a new connection and reads one reply frame (or whatever
// comes until the deadline), then closes.
func (h *hostileWorker) exchange(raw []byte) {
	c, err := h.dial()
	if err != nil {
		h.pause()
		return
	}
	defer c.Close()
	h.st.Frames.Add(1)
	if _, err := c.Write(raw); err != nil {
		return
	}
	var hdr [oob.HeaderSize]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return
	}
	n := binary.LittleEndian.Uint64(hdr[:8])
	if n == 0 || n > 1<<20 {
		return
	}
	body := make([]byte, n-1)
	if _, err := io.ReadFull(c, body); err == nil && refusal(body) {
		h.st.Refused.Add(1)
	}
}

// refusal says whether a reply body refuses (an error text, or a notify reply with its
// message empty, as a refused notify's is).
func refusal(body []byte) bool {
	var m map[string]any
	if json.Unmarshal(body, &m) != nil {
		return false
	}
	if e, ok := m["ts_error"]; ok && e != "" {
		return true
	}
	if s, ok := m["reply_msg"].(string); ok && s != "" && s != "success" {
		return true
	}
	if s, ok := m["notify_msg"].(string); ok && s == "" {
		return true
	}
	return false
}

// pause waits a little after a failed dial (the target restarting), so a burst does not spin.
func (h *hostileWorker) pause() {
	select {
	case <-time.After(20 * time.Millisecond):
	case <-h.ctx.Done():
	}
}

// ghostHandshake asks for a ctrl channel with a session and a QPN nobody owns.
func (h *hostileWorker) ghostHandshake() {
	body := fmt.Sprintf(`{"local_nic_path":"ghost-%d@%s:%d","peer_nic_path":"__ctrl__","qp_num":[],"local_lid":0,`+
		`"local_gid":"0000:0000:0000:0000:0000:ffff:7f00:0002","ctrl_channel":true,"notify_qp_num":%d,"notify_rq_depth":64,`+
		`"ts_session":%d,"ts_token":%d,"ts_extensions":true}`,
		h.r.Uint32(), h.src, 1024+h.r.IntN(60000), 1+h.r.Uint32N(1<<24-1), h.r.Uint64()>>1|1, h.r.Uint64()>>1|1)
	h.exchange(oob.AppendFrame(nil, oob.TypeConnection, []byte(body)))
}

// forged sends a notify in as's name: a soak name of a call it may or may not have made,
// its payload's bytes, its address as ts_from, and a session, seq and token invented.
func (h *hostileWorker) forged(as Identity) {
	s, p := 1+h.r.Uint64N(1<<12), 1+h.r.Uint64N(1<<12)
	size := h.r.IntN(128)
	msg := make([]byte, size)
	FillPayload(msg, p)
	req := map[string]any{
		"name":       NotifyName(as.ID, s, p, size),
		"ts_msg_b64": msg, // encoding/json writes []byte as base64
		"notify_msg": "",
		"ts_from":    as.Addr,
		"ts_session": h.r.Uint64()>>1 | 1,
		"ts_seq":     1 + h.r.Uint64N(1<<16),
		"ts_token":   h.r.Uint64() >> 1,
	}
	switch h.r.IntN(3) {
	case 0:
		delete(req, "ts_token") // no token at all
	case 1:
		req["ts_to"] = h.r.Uint64()>>1 | 1
	}
	body, _ := json.Marshal(req)
	h.exchange(oob.AppendFrame(nil, oob.TypeNotify, body))
}

// garbage sends one of the things that are no protocol, or holds an idle connection.
func (h *hostileWorker) garbage(idle bool) {
	if idle {
		if c, err := h.dial(); err == nil {
			_ = c.SetDeadline(time.Time{})
			go func() { <-h.ctx.Done(); c.Close() }() // held until the burst ends
		}
		return
	}
	var raw []byte
	switch h.r.IntN(6) {
	case 0: // random bytes
		raw = make([]byte, 1+h.r.IntN(4096))
		for i := range raw {
			raw[i] = byte(h.r.Uint32())
		}
	case 1: // a length no frame has
		raw = binary.LittleEndian.AppendUint64(nil, 1<<60+h.r.Uint64N(1<<20))
		raw = append(raw, byte(oob.TypeNotify), '{')
	case 2: // a frame cut short
		raw = oob.AppendFrame(nil, oob.TypeNotify, []byte(`{"name":"`+HostileClassicPrefix+`cut","notify_msg":"xxxxxxxx"}`))
		raw = raw[:oob.HeaderSize+h.r.IntN(len(raw)-oob.HeaderSize)]
	case 3: // bad JSON
		raw = oob.AppendFrame(nil, oob.MsgType(h.r.IntN(4)), []byte(`{"name":`+strconv.Itoa(h.r.Int())+`,"notify_msg":[}`))
	case 4: // a type nobody knows
		raw = oob.AppendFrame(nil, oob.MsgType(4+h.r.IntN(100)), []byte(`{}`))
	case 5: // a plain Mooncake notify: delivered by the protocol, left out by the agents
		raw = oob.AppendFrame(nil, oob.TypeNotify, []byte(fmt.Sprintf(`{"name":"%s%d","notify_msg":"x"}`, HostileClassicPrefix, h.r.Uint32())))
	}
	h.exchange(raw)
}
