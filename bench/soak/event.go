package soak

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/twosided/twosided/bench/soak/mix"
)

// The event kinds. Agents write start, result, deliver, early_done, up, closed, opdone,
// hang, log and bye on their stdout; the parent makes begin, kill, dispatch and fault
// itself. The parent writes its commands (op, reopen, pause, slow, stop) on an agent's
// stdin in the same format.
const (
	// KindBegin: the parent starts incarnation Inc of engine slot Slot (a process spawned
	// or an engine reopened). Its engine id is EngineID(Slot, Inc).
	KindBegin = "begin"
	// KindKill: the parent killed incarnation Inc of Slot with SIGKILL.
	KindKill = "kill"
	// KindDispatch: the parent handed operation Op of stream (Eng, Slot) to its agent.
	KindDispatch = "dispatch"
	// KindTaken: the parent read, once incarnation Eng's process was reaped, that it had
	// put N delivery events on their way (taken.go).
	KindTaken = "taken"
	// KindFault: a fault the parent injected that the checker only records (Err says which).
	KindFault = "fault"

	// KindUp: engine Eng (slot Slot) listens on Addr.
	KindUp = "up"
	// KindStart: sender Eng starts call S of its stream to Slot, payload P, in operation Op;
	// with Answer, call S of its answer stream to Slot, made from its handler for a notify
	// of engine From (no operation).
	KindStart = "start"
	// KindResult: call S (payload P) of sender Eng to Slot returned; Class is ok, maybe
	// (the error wraps ErrMaybeDelivered) or failed; Err is the error's text.
	KindResult = "result"
	// KindDeliver: engine Eng handed its application call S (payload P) of sender From (with
	// Answer: of From's answer stream); Bad names what is wrong with the payload, if anything.
	KindDeliver = "deliver"
	// KindEarlyDone: the done of answer S (payload P) of Eng to Slot ran before the
	// SendNotifyAsync that made it returned (Answer is set).
	KindEarlyDone = "early_done"
	// KindClosed: engine Eng was closed cleanly and everything it held was delivered.
	KindClosed = "closed"
	// KindOpDone: sender Eng finished operation Op of its stream to Slot.
	KindOpDone = "opdone"
	// KindHang: a call of engine Eng did not return within its bound (Err says which).
	KindHang = "hang"
	// KindCrash: the parent saw an agent exit on its own, write a bad line, or fail to
	// start (Err says which).
	KindCrash = "crash"
	// KindLog: a line for the operator (Err).
	KindLog = "log"
	// KindBye: the agent closed its engines and exits.
	KindBye = "bye"
	// KindRes: what the agent's process holds now (Res), in answer to CmdSample.
	KindRes = "res"
	// KindLeak, KindSlowRecovery: the parent judged an agent's resources grown past their
	// baseline, or a restarted engine reached late (Err says how).
	KindLeak         = "leak"
	KindSlowRecovery = "slow_recovery"
	// KindStalled: sender Eng's async sends to Slot wait for credit on a channel that is up
	// with nothing in flight (Err says what the channel showed), in answer to CmdWatchStall.
	KindStalled = "stalled"

	// Commands, parent to agent.
	CmdOp     = "op"     // run Op: Sends from Eng to Slot over Names, Window at a time
	CmdReopen = "reopen" // close engine Slot (draining it) and open incarnation Inc
	CmdPause  = "pause"  // engine Slot's consumer takes nothing for MS milliseconds
	CmdSlow   = "slow"   // engine Slot's consumer waits US microseconds per notify
	CmdStop   = "stop"   // close every engine, drain, say bye and exit
	CmdCut    = "cut"    // shut down every OOB TCP connection of the agent's engines
	CmdSample = "sample" // say what the process holds (KindRes); Op sampleFinal: the last, once the operations ended
	// CmdWatchStall: for MS milliseconds, watch for an async send of this agent's to Slot
	// (listening on Addr) stalled on credit, and say KindStalled once when one is.
	CmdWatchStall = "watchstall"
)

// Call classes of a result.
const (
	ClassOK     = "ok"
	ClassMaybe  = "maybe"
	ClassFailed = "failed"
)

// Event is one line of the protocol between the parent and its agents, and one input of
// the checker. Fields not used by a kind are left zero.
type Event struct {
	K     string   `json:"k"`
	Eng   string   `json:"e,omitempty"`
	Slot  string   `json:"slot,omitempty"`
	Inc   int      `json:"inc,omitempty"`
	Addr  string   `json:"addr,omitempty"`
	From  string   `json:"from,omitempty"`
	Op    uint64   `json:"op,omitempty"`
	S     uint64   `json:"s,omitempty"`
	P     uint64   `json:"p,omitempty"`
	Class string   `json:"c,omitempty"`
	Err   string   `json:"err,omitempty"`
	Bad   string   `json:"bad,omitempty"`
	Names []string `json:"names,omitempty"`
	Sends []Send   `json:"sends,omitempty"`
	// Window: how many sends of an op are in flight at once (1: SendNotify one by one; more:
	// SendNotifyAsync windows).
	Window int `json:"w,omitempty"`
	MS     int `json:"ms,omitempty"`
	US     int `json:"us,omitempty"`
	// Queue, Consumer, Ring (KindBegin): the incarnation's receive queue bound, how its
	// application takes notifies, and its channels' RECV ring (0: no channels).
	Queue    int    `json:"q,omitempty"`
	Consumer string `json:"consumer,omitempty"`
	Ring     int    `json:"ring,omitempty"`
	// N (KindTaken): delivery events put.
	N uint64 `json:"n,omitempty"`
	// Answer (KindStart, KindResult, KindDeliver, KindEarlyDone, KindHang): the call is of
	// the sender's answer stream to Slot, made from its handler, not of an operation
	// (answer.go).
	Answer bool `json:"ans,omitempty"`
	// Res: an agent's resources (KindRes).
	Res *Res `json:"res,omitempty"`
}

// sampleFinal marks the sample the parent takes once the run's operations ended.
const sampleFinal = 1

// Res is what an agent's process holds at one moment.
type Res struct {
	RSSKiB     int64 `json:"rss_kib"`
	FDs        int   `json:"fds"`
	Goroutines int   `json:"goroutines"`
	Peers      int   `json:"peers"`    // peer entries of its engines
	Channels   int   `json:"channels"` // ctrl channels up
}

// Send is one notify of an op (package mix).
type Send = mix.Send

// Bounds of a decoded line: a peer process is trusted no further than this.
const (
	MaxLine     = 64 << 10
	maxIDLen    = 64
	maxErrLen   = 2048
	maxSends    = 256
	maxNames    = 4
	maxNameLen  = 256
	maxSize     = 128 << 20
	maxRetries  = 16
	maxDeadline = 600_000
	maxPauseMS  = 600_000
	maxSlowUS   = 1_000_000
	maxInc      = 1 << 30
	maxRes      = 1 << 40
)

// ErrDecode is wrapped by every error of Decode.
var ErrDecode = errors.New("soak: bad event line")

// Encode returns ev as one line, newline included.
func Encode(ev Event) []byte {
	b, err := json.Marshal(ev)
	if err != nil { // only plain fields: cannot happen
		panic(err)
	}
	return append(b, '\n')
}

// Decode parses one line (without or with its newline) and checks every field of its kind.
func Decode(line []byte) (Event, error) {
	var ev Event
	line = bytes.TrimSuffix(line, []byte("\n"))
	if len(line) > MaxLine {
		return ev, fmt.Errorf("%w: %d bytes, over %d", ErrDecode, len(line), MaxLine)
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ev); err != nil {
		return Event{}, fmt.Errorf("%w: %v", ErrDecode, err)
	}
	if dec.More() {
		return Event{}, fmt.Errorf("%w: data after the object", ErrDecode)
	}
	if err := ev.validate(); err != nil {
		return Event{}, fmt.Errorf("%w: %s: %v", ErrDecode, ev.K, err)
	}
	return ev, nil
}

func (ev *Event) validate() error {
	need := func(field, v string, check func(string) error) error {
		if err := check(v); err != nil {
			return fmt.Errorf("field %s: %v", field, err)
		}
		return nil
	}
	if len(ev.Err) > maxErrLen {
		return fmt.Errorf("field err: %d bytes, over %d", len(ev.Err), maxErrLen)
	}
	if ev.Inc < 0 || ev.Inc > maxInc {
		return fmt.Errorf("field inc: %d out of 0..%d", ev.Inc, maxInc)
	}
	if ev.MS < 0 || ev.MS > maxPauseMS || ev.US < 0 || ev.US > maxSlowUS {
		return errors.New("field ms or us out of range")
	}
	if ev.Answer && ev.K != KindStart && ev.K != KindResult && ev.K != KindDeliver && ev.K != KindEarlyDone && ev.K != KindHang {
		return errors.New("field ans: only on start, result, deliver, early_done and hang")
	}
	if ev.Window < 0 || ev.Window > maxSends {
		return fmt.Errorf("field w: %d out of 0..%d", ev.Window, maxSends)
	}
	if len(ev.Names) > maxNames {
		return fmt.Errorf("field names: %d, over %d", len(ev.Names), maxNames)
	}
	for _, n := range ev.Names {
		if n == "" || len(n) > maxNameLen {
			return fmt.Errorf("field names: a name of %d bytes", len(n))
		}
	}
	if len(ev.Sends) > maxSends {
		return fmt.Errorf("field sends: %d, over %d", len(ev.Sends), maxSends)
	}
	for i, s := range ev.Sends {
		switch {
		case s.P == 0:
			return fmt.Errorf("field sends[%d].p: zero", i)
		case s.Size < 0 || s.Size > maxSize:
			return fmt.Errorf("field sends[%d].n: %d out of 0..%d", i, s.Size, maxSize)
		case s.Name < 0 || (s.Name >= len(ev.Names) && s.Name > 0):
			return fmt.Errorf("field sends[%d].name: %d, not one of %d names", i, s.Name, len(ev.Names))
		case s.Retries < 0 || s.Retries > maxRetries:
			return fmt.Errorf("field sends[%d].r: %d out of 0..%d", i, s.Retries, maxRetries)
		case s.DeadlineMS < 0 || s.DeadlineMS > maxDeadline:
			return fmt.Errorf("field sends[%d].dl: %d out of 0..%d", i, s.DeadlineMS, maxDeadline)
		}
	}
	switch ev.K {
	case KindBegin, KindKill:
		return need("slot", ev.Slot, checkSlot)
	case KindDispatch, KindOpDone:
		if err := need("e", ev.Eng, checkEngine); err != nil {
			return err
		}
		return need("slot", ev.Slot, checkSlot)
	case KindUp:
		if err := need("e", ev.Eng, checkEngine); err != nil {
			return err
		}
		if err := need("slot", ev.Slot, checkSlot); err != nil {
			return err
		}
		if slot, _, _ := ParseEngineID(ev.Eng); slot != ev.Slot {
			return fmt.Errorf("field e: %q is not of slot %q", ev.Eng, ev.Slot)
		}
		return nil
	case KindStart, KindResult, KindEarlyDone:
		if err := need("e", ev.Eng, checkEngine); err != nil {
			return err
		}
		if err := need("slot", ev.Slot, checkSlot); err != nil {
			return err
		}
		if ev.S == 0 || ev.P == 0 {
			return errors.New("field s or p: zero")
		}
		if ev.K == KindStart && ev.Answer {
			if err := need("from", ev.From, checkEngine); err != nil {
				return err
			}
		}
		if ev.K == KindResult && ev.Class != ClassOK && ev.Class != ClassMaybe && ev.Class != ClassFailed {
			return fmt.Errorf("field c: %q is not ok, maybe or failed", ev.Class)
		}
		return nil
	case KindDeliver:
		if err := need("e", ev.Eng, checkEngine); err != nil {
			return err
		}
		if ev.Bad == "" { // a malformed payload may lack a sender
			if err := need("from", ev.From, checkEngine); err != nil {
				return err
			}
			if ev.S == 0 || ev.P == 0 {
				return errors.New("field s or p: zero")
			}
		}
		return nil
	case KindClosed, KindHang, KindCrash, KindLeak, KindSlowRecovery, KindTaken:
		return need("e", ev.Eng, checkEngine)
	case KindRes:
		r := ev.Res
		if r == nil {
			return errors.New("field res: missing")
		}
		for _, v := range []int64{r.RSSKiB, int64(r.FDs), int64(r.Goroutines), int64(r.Peers), int64(r.Channels)} {
			if v < 0 || v > maxRes {
				return fmt.Errorf("field res: %d out of 0..%d", v, int64(maxRes))
			}
		}
		return nil
	case KindFault, KindLog, KindBye, CmdStop, CmdCut, CmdSample:
		return nil
	case KindStalled:
		if err := need("e", ev.Eng, checkEngine); err != nil {
			return err
		}
		return need("slot", ev.Slot, checkSlot)
	case CmdWatchStall:
		if err := need("slot", ev.Slot, checkSlot); err != nil {
			return err
		}
		if ev.Addr == "" || len(ev.Addr) > maxNameLen {
			return fmt.Errorf("field addr: %d bytes", len(ev.Addr))
		}
		return nil
	case CmdOp:
		if err := need("e", ev.Eng, checkEngine); err != nil {
			return err
		}
		if err := need("slot", ev.Slot, checkSlot); err != nil {
			return err
		}
		if len(ev.Names) == 0 || len(ev.Sends) == 0 || ev.Window == 0 {
			return errors.New("an op needs names, sends and a window")
		}
		return nil
	case CmdReopen, CmdPause, CmdSlow:
		return need("slot", ev.Slot, checkSlot)
	}
	return fmt.Errorf("unknown kind %q", ev.K)
}

// SlotName names engine e of agent a: "a<a>e<e>".
func SlotName(agent, engine int) string {
	return "a" + strconv.Itoa(agent) + "e" + strconv.Itoa(engine)
}

// EngineID names incarnation inc of a slot: "<slot>.<inc>". A restarted or reopened
// engine is a new incarnation, as it is a new peer for the engines it talks to.
func EngineID(slot string, inc int) string { return slot + "." + strconv.Itoa(inc) }

// ParseEngineID splits an engine id into its slot and incarnation.
func ParseEngineID(id string) (slot string, inc int, err error) {
	slot, n, ok := strings.Cut(id, ".")
	if !ok {
		return "", 0, fmt.Errorf("engine id %q has no incarnation", id)
	}
	if err := checkSlot(slot); err != nil {
		return "", 0, err
	}
	inc, err = strconv.Atoi(n)
	if err != nil || inc < 0 || inc > maxInc || strconv.Itoa(inc) != n {
		return "", 0, fmt.Errorf("engine id %q: bad incarnation", id)
	}
	return slot, inc, nil
}

// ParseSlot splits "a<a>e<e>".
func ParseSlot(slot string) (agent, engine int, err error) {
	a, e, ok := strings.Cut(strings.TrimPrefix(slot, "a"), "e")
	if !ok || !strings.HasPrefix(slot, "a") || len(slot) > maxIDLen {
		return 0, 0, fmt.Errorf("slot %q is not a<n>e<n>", slot)
	}
	agent, err1 := strconv.Atoi(a)
	engine, err2 := strconv.Atoi(e)
	if err1 != nil || err2 != nil || agent < 0 || engine < 0 || agent > 9999 || engine > 9999 ||
		strconv.Itoa(agent) != a || strconv.Itoa(engine) != e {
		return 0, 0, fmt.Errorf("slot %q is not a<n>e<n>", slot)
	}
	return agent, engine, nil
}

func checkSlot(s string) error { _, _, err := ParseSlot(s); return err }

func checkEngine(s string) error { _, _, err := ParseEngineID(s); return err }
