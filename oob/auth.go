package oob

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"hash"
)

// Pre-shared-key authentication of a persistent connection, folded into the ts_hello
// negotiation (see the package doc, "Authentication").

const (
	authScheme = "hmac-sha256"
	nonceSize  = 16
	macSize    = sha256.Size

	fAuth         = "ts_auth"
	fAuthRequired = "ts_auth_required"
	fNonce        = "ts_nonce"
	fMAC          = "ts_mac"

	// MinAuthKey is the shortest accepted Config.AuthKey.
	MinAuthKey = 16
	// MaxAuthKey is the longest accepted Config.AuthKey.
	MaxAuthKey = 1024

	// preAuthMaxFrame caps frames on a server connection that must authenticate and has
	// not yet (a hello or a proof is a few hundred bytes).
	preAuthMaxFrame = 64 << 10
)

// authLabel starts every MAC input; the version keeps MACs of a later scheme apart.
const authLabel = "twosided oob auth v1\x00"

// MAC directions: who proves the key. A proof is never valid in the other direction.
const (
	dirClient byte = 'C'
	dirServer byte = 'S'
)

// Reasons sent to a peer in error replies.
var (
	errAuthRequired  = errors.New("authentication required")
	errAuthFailed    = errors.New("authentication failed")
	errAuthUnexpect  = errors.New("authentication failed: unexpected ts_mac")
	errTooManyShakes = errors.New("too many pending handshakes")
)

type authState uint8

const (
	authNone    authState = iota // nothing exchanged (or no key)
	authPending                  // server: challenge sent; client: proof sent
	authOK                       // the peer proved the key
)

// authKeys is a Node's key material; loop-only (the HMAC state is reused).
type authKeys struct {
	on       bool // a key is set
	required bool // on and !AllowUnauthenticated
	mac      hash.Hash
	sum      [macSize]byte
}

func newAuthKeys(cfg *Config) authKeys {
	if cfg.AuthKey == nil {
		return authKeys{}
	}
	return authKeys{on: true, required: !cfg.AllowUnauthenticated, mac: hmac.New(sha256.New, cfg.AuthKey)}
}

// proof computes HMAC-SHA256(key, label || dir || Nc || Ns). Both nonces are fixed
// length, so the input has one parse.
func (a *authKeys) proof(dir byte, nc, ns *[nonceSize]byte) *[macSize]byte {
	a.mac.Reset()
	a.mac.Write([]byte(authLabel))
	a.mac.Write([]byte{dir})
	a.mac.Write(nc[:])
	a.mac.Write(ns[:])
	a.mac.Sum(a.sum[:0])
	return &a.sum
}

// verify compares a peer's proof with the expected one in constant time.
func (a *authKeys) verify(dir byte, nc, ns *[nonceSize]byte, got *[macSize]byte) bool {
	return hmac.Equal(a.proof(dir, nc, ns)[:], got[:])
}

func newNonce(dst *[nonceSize]byte) {
	// crypto/rand.Read does not fail (the runtime aborts if the OS source is gone).
	_, _ = rand.Read(dst[:])
}

// connAuth is the authentication state of one connection.
type connAuth struct {
	state     authState
	local     [nonceSize]byte // our nonce (server: Ns, client: Nc)
	peer      [nonceSize]byte // the peer's nonce
	peerNonce bool            // peer sent one
	probeID   uint64          // client: id of the proof probe
}

func (o *jsonObj) hex(k string, v []byte) {
	o.key(k)
	o.b = append(o.b, '"')
	o.b = hex.AppendEncode(o.b, v)
	o.b = append(o.b, '"')
}

// hexFixed reads a string of exactly 2*len(dst) hex digits into dst; scratch holds the
// text and is returned for reuse.
func (r *jsonReader) hexFixed(field string, dst, scratch []byte) ([]byte, error) {
	scratch, err := r.str(field, scratch[:0])
	if err != nil {
		return scratch, err
	}
	if len(scratch) != 2*len(dst) {
		return scratch, jsonErr(field, "%d characters, want %d hex digits", len(scratch), 2*len(dst))
	}
	if _, err := hex.Decode(dst, scratch); err != nil {
		return scratch, jsonErr(field, "not hex: %v", err)
	}
	return scratch, nil
}

// appendHello writes the client's first frame on a persistent connection: {"ts_hello":1},
// plus "ts_nonce" when the client has a key.
func appendHello(dst []byte, nc *[nonceSize]byte) []byte {
	dst, at := beginFrame(dst, TypeProbe)
	o := jsonObj{b: append(dst, '{')}
	o.uint(fHello, helloVersion)
	if nc != nil {
		o.hex(fNonce, nc[:])
	}
	return finishFrame(append(o.b, '}'), at)
}

// appendHelloReply writes the server's answer to a hello. With a key it carries the
// challenge (ts_auth, ts_nonce, ts_auth_required) and, when the client sent a nonce, the
// server's proof (ts_mac).
func appendHelloReply(dst []byte, m reqMeta, a *authKeys, ca *connAuth, maxFrame int) []byte {
	dst, at := beginFrame(dst, TypeProbe)
	o := jsonObj{b: append(dst, '{')}
	o.uint(fHello, helloVersion)
	if a.on {
		o.str(fAuth, authScheme)
		o.hex(fNonce, ca.local[:])
		if a.required {
			o.boolean(fAuthRequired, true)
		}
		if ca.peerNonce {
			o.hex(fMAC, a.proof(dirServer, &ca.peer, &ca.local)[:])
		}
	}
	// The client measures its requests' encoded frames against this limit.
	o.uint(fMaxFrame, uint64(maxFrame))
	// The client may send its notifies as compact frames (compact.go).
	o.uint(fCompact, 1)
	if m.hasID {
		o.uint(fID, m.id)
	}
	return finishFrame(append(o.b, '}'), at)
}

// appendAuthProof writes the client's proof: a Probe {"ts_id":N,"ts_mac":"..."}.
func appendAuthProof(dst []byte, id uint64, mac *[macSize]byte) []byte {
	dst, at := beginFrame(dst, TypeProbe)
	o := jsonObj{b: append(dst, '{')}
	o.uint(fID, id)
	o.hex(fMAC, mac[:])
	return finishFrame(append(o.b, '}'), at)
}

// probeInfo is what a server reads from a Probe request.
type probeInfo struct {
	m        reqMeta
	hello    uint64
	bye      uint64 // ts_bye: the peer is closing
	from     string // ts_from of a bye
	session  uint64 // ts_session of a bye: the closing peer's session
	nonce    [nonceSize]byte
	hasNonce bool
	mac      [macSize]byte
	hasMAC   bool
}

// probeDecoder decodes Probe requests into reused buffers; loop-only.
type probeDecoder struct {
	key, text, from []byte
	p               probeInfo
}

func (d *probeDecoder) decode(body []byte) (*probeInfo, error) {
	d.p = probeInfo{}
	d.from = d.from[:0]
	p := &d.p
	r := jsonReader{b: body}
	var err error
	d.key, err = r.object(d.key, func(k []byte) error {
		var err error
		if r.isNull() {
			return nil
		}
		switch string(k) {
		case fHello:
			p.m.twosided = true
			p.hello, err = r.uint(fHello, 1<<32-1)
		case fBye:
			p.m.twosided = true
			p.bye, err = r.uint(fBye, 1<<32-1)
		case fFrom:
			p.m.twosided = true
			d.from, err = r.strMax(fFrom, d.from[:0], MaxFromLen)
		case fSession:
			p.m.twosided = true
			p.session, err = r.uint(fSession, 1<<64-1)
		case fID:
			p.m.twosided, p.m.hasID = true, true
			p.m.id, err = r.uint(fID, 1<<64-1)
		case fNonce:
			p.m.twosided, p.hasNonce = true, true
			d.text, err = r.hexFixed(fNonce, p.nonce[:], d.text)
		case fMAC:
			p.m.twosided, p.hasMAC = true, true
			d.text, err = r.hexFixed(fMAC, p.mac[:], d.text)
		default:
			err = r.skip(0)
		}
		return err
	})
	if err == nil {
		err = r.end()
	}
	if err == nil && p.bye != 0 && len(d.from) > 0 {
		p.from = string(d.from)
	}
	return p, err
}
