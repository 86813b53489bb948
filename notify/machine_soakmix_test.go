package notify

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/twosided/twosided/bench/soak/mix"
)

// The soak's operation mix (package mix, the generator `twosided soak` draws its streams
// from) driven through the peer machines' simulation: three engines with two names each,
// a stream between every ordered pair making SendNotify runs and SendNotifyAsync windows,
// retries with the same ID on the other name while the outcome is unknown, and channels
// cut at random, all in one seeded schedule. The checks are the soak checker's: per pair,
// every acknowledged notify delivered exactly once, in call order, none whose send failed
// definitely. A soak seed (TWOSIDED_SIM_SEED=n, with `go test -run TestMachineSoakMix`)
// replays the same streams here, deterministically.

const simMixOps = 60 // operations per stream

type simCall struct {
	n     int // the stream's call number: the send order
	p     uint64
	try   int
	reqID reqID
}

type simStream struct {
	from, to *simEngine
	names    []string
	gen      *mix.StreamGen
	ops      int
	calls    int
	op       mix.Op
	next     int       // the next send of op (window 1)
	out      []simCall // in flight
	retry    []simCall // maybe-delivered of a window, to retry one by one
	byP      map[uint64]*simPayload
	sends    map[uint64]mix.Send
	log      []string
}

type simPayload struct {
	acked, maybe, failed int
	id                   bool
}

func (st *simStream) key() string { return st.from.name + ">" + st.to.name }

// call sends payload p's try; its message names the pair, the call and the payload.
func (st *simStream) call(sd mix.Send, try int) {
	st.calls++
	msg := fmt.Sprintf("%s c%d p%d t%d", st.key(), st.calls, sd.P, try)
	nid := ""
	if sd.ID {
		nid = "p" + strconv.FormatUint(sd.P, 10)
	}
	name := st.names[(sd.Name+try)%len(st.names)]
	id := st.from.send(name, msg, nid)
	st.out = append(st.out, simCall{n: st.calls, p: sd.P, try: try, reqID: id})
	st.log = append(st.log, fmt.Sprintf("call %d: p%d try %d to %s (req %d)", st.calls, sd.P, try, name, id))
}

// advance moves the stream on once its calls in flight have results; false when done.
func (st *simStream) advance() bool {
	for _, c := range st.out {
		if _, ok := st.from.results[c.reqID]; !ok {
			return true // still waiting
		}
	}
	for _, c := range st.out {
		err := st.from.results[c.reqID]
		pl := st.byP[c.p]
		sd := st.sends[c.p]
		switch {
		case err == nil:
			pl.acked++
		case errors.Is(err, ErrMaybeDelivered):
			pl.maybe++
			if sd.ID && c.try < sd.Retries {
				st.retry = append(st.retry, simCall{p: c.p, try: c.try + 1})
			}
		default:
			pl.failed++
		}
		st.log = append(st.log, fmt.Sprintf("call %d (p%d) returned %v", c.n, c.p, err))
	}
	st.out = st.out[:0]
	if len(st.retry) > 0 { // retries go one at a time, as the soak's agents make them
		r := st.retry[0]
		st.retry = st.retry[1:]
		st.call(st.sends[r.p], r.try)
		return true
	}
	if st.op.Window <= 1 && st.next < len(st.op.Sends) {
		st.call(st.op.Sends[st.next], 0)
		st.next++
		return true
	}
	if st.ops == simMixOps {
		return false
	}
	st.ops++
	st.op = st.gen.Next()
	for _, sd := range st.op.Sends {
		st.sends[sd.P] = sd
		st.byP[sd.P] = &simPayload{id: sd.ID}
	}
	if st.op.Window > 1 {
		for _, sd := range st.op.Sends {
			st.call(sd, 0)
		}
	} else {
		st.call(st.op.Sends[0], 0)
		st.next = 1
	}
	return true
}

// check judges the pair's history at its receiver.
func (st *simStream) check(t *testing.T, seed uint64) {
	t.Helper()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d, %s: %s\nstream:\n%s", seed, st.key(), fmt.Sprintf(format, args...), strings.Join(st.log, "\n"))
	}
	seen := map[uint64]bool{}
	last := 0
	for _, n := range st.to.got {
		m := string(n.Msg)
		if !strings.HasPrefix(m, st.key()+" ") {
			continue
		}
		var c, try int
		var p uint64
		if _, err := fmt.Sscanf(m[len(st.key())+1:], "c%d p%d t%d", &c, &p, &try); err != nil {
			fail("delivered %q: %v", m, err)
		}
		if seen[p] {
			fail("p%d delivered twice (again as call %d)", p, c)
		}
		seen[p] = true
		if c <= last {
			fail("call %d (p%d) delivered after call %d", c, p, last)
		}
		last = c
		if pl := st.byP[p]; pl != nil && pl.acked == 0 && pl.maybe == 0 {
			fail("p%d delivered though every try failed definitely", p)
		}
	}
	for p, pl := range st.byP {
		if pl.acked > 0 && !seen[p] {
			fail("p%d acknowledged and never delivered", p)
		}
	}
}

func TestMachineSoakMix(t *testing.T) {
	seeds := make([]uint64, 0, 40)
	for s := uint64(1); s <= 40; s++ {
		seeds = append(seeds, s)
	}
	if testing.Short() {
		seeds = seeds[:8]
	}
	if v := os.Getenv("TWOSIDED_SIM_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("TWOSIDED_SIM_SEED=%q: not a number", v)
		}
		seeds = []uint64{s}
	}
	for _, seed := range seeds {
		runSoakMix(t, seed)
	}
}

func runSoakMix(t *testing.T, seed uint64) {
	n := newSimNet(t, seed)
	fr := mix.Seeded(seed, "sim-faults")
	cfg := simCfg()
	cfg.channels = fr.IntN(4) != 0 // a quarter of the seeds over OOB only
	names := map[string][]string{}
	var engines []*simEngine
	for i, e := range []string{"a", "b", "c"} {
		names[e] = []string{"127.0.0.1:" + e, "localhost:" + e}
		engines = append(engines, n.add(e, uint64(10*(i+1)), cfg, names[e]...))
	}
	m := mix.Mix{MaxSize: 64, MaxWindow: 8}
	if os.Getenv("SIMTRACE") != "" {
		for _, e := range engines {
			e.trace = func(a mAction) {
				if a.kind != aTimer && a.kind != aComplete {
					t.Logf("%s %v name=%s ch=%d req=%d seq=%d sess=%d err=%v msg=%s", e.name, a.kind, a.name, a.ch, a.req, a.seq, a.session, a.err, a.n.Msg)
				}
			}
		}
	}
	var streams []*simStream
	for _, from := range engines {
		for _, to := range engines {
			if from != to {
				streams = append(streams, &simStream{from: from, to: to, names: names[to.name],
					gen: mix.NewStreamGen(seed, from.name, to.name, m), byP: map[uint64]*simPayload{}, sends: map[uint64]mix.Send{}})
			}
		}
	}
	live := len(streams)
	done := make([]bool, len(streams))
	for i, st := range streams {
		if !st.advance() {
			done[i] = true
			live--
		}
	}
	cuts := 0
	after := func() {
		for i, st := range streams {
			if !done[i] && !st.advance() {
				done[i] = true
				live--
			}
		}
		// A channel cut now and then, at a random engine (a cut link: both ends learn).
		if cfg.channels && fr.IntN(400) == 0 {
			e := engines[fr.IntN(len(engines))]
			for _, id := range sortedChans(e) {
				if l := e.links[id]; !l.dead {
					cuts++
					e.closeLink(id)
					e.m.chanClosed(n.now, id, errors.New("cut"))
					e.perform()
					break
				}
			}
		}
	}
	for round := 0; live > 0; round++ {
		if round == 1000 {
			t.Fatalf("seed %d: %d streams never finished", seed, live)
		}
		n.runWith(n.now.Add(cfg.connectTimeout), after)
		after()
	}
	n.run()
	for _, st := range streams {
		st.check(t, seed)
	}
	if testing.Verbose() {
		t.Logf("seed %d: channels %v, %d channel cuts, %d streams of %d ops", seed, cfg.channels, cuts, len(streams), simMixOps)
	}
}

func sortedChans(e *simEngine) []chanID {
	ids := make([]chanID, 0, len(e.links))
	for id := range e.links {
		ids = append(ids, id)
	}
	for i := 1; i < len(ids); i++ { // few: insertion sort keeps the schedule seeded
		for j := i; j > 0 && ids[j] < ids[j-1]; j-- {
			ids[j], ids[j-1] = ids[j-1], ids[j]
		}
	}
	return ids
}
