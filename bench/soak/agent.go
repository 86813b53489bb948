package soak

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twosided/twosided/notify"
)

// An agent is a child process of the soak: it runs the engines of its slots, executes the
// operations the parent sends on its stdin and reports, one event per line on its stdout,
// every call it starts, every result and every notify its applications take.

// AgentSpec is what an agent runs, given as JSON in --spec.
type AgentSpec struct {
	Index    int           `json:"index"`
	Engines  []AgentEngine `json:"engines"`
	Provider string        `json:"provider,omitempty"` // rdma_twosided engines' provider; "": as notify picks
	Seed     uint64        `json:"seed"`
	// Plant: lose, dup or reorder one delivery on purpose, outside the engine, so that the
	// soak shows it catches it.
	Plant string `json:"plant,omitempty"`
	// OOBPorts: the OOB listen ports of every engine of the run; a cut shuts down the TCP
	// connections of this process that have one of them at either end.
	OOBPorts []int `json:"oob_ports,omitempty"`
	// Taken: the file in which the agent counts the delivery events it puts (taken.go); ""
	// (an agent on another host): none.
	Taken string `json:"taken,omitempty"`
	// Names: by slot, the names its engine is sent to by (as an operation's Names): a
	// handler's answer goes to the engine whose notify it took by one of them (answer.go).
	Names map[string][]string `json:"names,omitempty"`
}

// AgentEngine is one slot of an agent.
type AgentEngine struct {
	Slot      string `json:"slot"`
	Inc       int    `json:"inc"`
	Addr      string `json:"addr"`
	Transport string `json:"transport"`
}

// Plants.
const (
	PlantLose    = "lose"
	PlantDup     = "dup"
	PlantReorder = "reorder"
	// PlantLeak: the agent starts goroutines it never ends just before its last sample
	// (the one the parent takes once the operations ended), as a leak would have.
	PlantLeak = "leak"
)

// plantAt is the delivery, counted over the agent, that a plant acts on; lose acts on
// plantLoses of them, plantAt apart, so that one is of a call that was acknowledged.
const (
	plantAt    = 20
	plantLoses = 3
)

// Bounds of the agent's own checks: a call or a Close still running this long after its own
// bound is reported as a hang. They only guard against hangs; they are not measurements.
const (
	hangGrace    = 60 * time.Second
	asyncBound   = 30 * time.Second // the engine's bound of a SendNotifyAsync
	closeTimeout = 10 * time.Second
)

type agent struct {
	spec AgentSpec
	out  *outQueue
	ctx  context.Context

	mu      sync.Mutex
	engines map[string]*agentEngine // by slot
	workers map[streamKey]chan Event
	async   map[streamKey]*atomic.Int32 // SendNotifyAsync calls of a stream without a result yet
	wg      sync.WaitGroup              // workers, reopens, stall watches
	calls   callWatch

	foreign atomic.Uint64 // hostile plain notifies taken

	taken   *takenFile     // nil: no counts asked for
	slotIdx map[string]int // slot -> its index in spec.Engines

	plantMu   sync.Mutex
	delivered int
	held      *Event // reorder: the delivery held back
}

type agentEngine struct {
	a         *agent
	slot, id  string
	addr      string
	transport string
	consumer  string
	ans       *answerer // nil: it does not answer from its handler
	e         *notify.Engine
	pauseTill atomic.Int64 // unix ns
	slowUS    atomic.Int64
	stop      chan struct{}
	done      chan struct{} // the consumer goroutine ended
	closeOnce sync.Once
	retired   bool // its workers were ended; under agent.mu
}

// RunAgent runs an agent until its stdin closes or a stop command: it answers on out.
func RunAgent(ctx context.Context, spec AgentSpec, in io.Reader, out io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a := &agent{spec: spec, out: newOutQueue(out), ctx: ctx, engines: map[string]*agentEngine{}, workers: map[streamKey]chan Event{},
		async: map[streamKey]*atomic.Int32{}}
	if spec.Taken != "" {
		t, err := openTaken(spec.Taken, len(spec.Engines))
		if err != nil {
			return fmt.Errorf("soak agent %d: %w", spec.Index, err)
		}
		a.taken, a.slotIdx = t, map[string]int{}
		for i, e := range spec.Engines {
			a.slotIdx[e.Slot] = i
		}
		// Never unmapped: a late delivery (a reactor thread's handler) may count into it
		// up to the process's exit, and the mapping is a page.
	}
	go a.out.run()
	defer a.out.close()
	watchDone := make(chan struct{})
	go func() { defer close(watchDone); a.calls.watch(ctx, a.out) }()
	defer func() { cancel(); <-watchDone }()

	for _, spec := range spec.Engines {
		ae, err := a.open(spec.Slot, spec.Inc, spec.Addr, spec.Transport)
		if err != nil {
			return err
		}
		a.engines[spec.Slot] = ae
	}
	lines := bufio.NewScanner(in)
	lines.Buffer(make([]byte, 0, 64<<10), MaxLine)
	for lines.Scan() {
		ev, err := Decode(lines.Bytes())
		if err != nil {
			a.log("bad command: %v", err)
			continue
		}
		switch ev.K {
		case CmdOp:
			a.op(ev)
		case CmdReopen:
			a.reopen(ev.Slot, ev.Inc)
		case CmdPause:
			if ae := a.engine(ev.Slot); ae != nil {
				ae.pauseTill.Store(time.Now().Add(time.Duration(ev.MS) * time.Millisecond).UnixNano())
			}
		case CmdSlow:
			if ae := a.engine(ev.Slot); ae != nil {
				ae.slowUS.Store(int64(ev.US))
			}
		case CmdCut:
			n, err := cutConns(a.spec.OOBPorts)
			if err != nil {
				a.log("cut: %v", err)
			}
			a.log("cut: %d OOB connections shut down", n)
		case CmdWatchStall:
			a.watchStall(ev.Slot, ev.Addr, time.Duration(ev.MS)*time.Millisecond)
		case CmdSample:
			if ev.Op == sampleFinal {
				if a.spec.Plant == PlantLeak {
					a.leak(ctx)
				}
				// What the process holds, not what the collector has yet to give back:
				// the run's largest windows of 1 MiB notifies leave a heap it returns
				// to the system only minutes later.
				debug.FreeOSMemory()
			}
			a.out.put(Event{K: KindRes, Res: a.sample()})
		case CmdStop:
			a.stopAll()
			a.out.put(Event{K: KindBye})
			return nil
		}
	}
	// The parent is gone: stop without ceremony.
	a.stopAll()
	return lines.Err()
}

func (a *agent) log(format string, args ...any) {
	a.out.put(Event{K: KindLog, Err: fmt.Sprintf(format, args...)})
}

func (a *agent) engine(slot string) *agentEngine {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.engines[slot]
}

// open starts incarnation inc of slot and its consumer, and reports it up.
func (a *agent) open(slot string, inc int, addr, transport string) (*agentEngine, error) {
	ae := &agentEngine{
		a: a, slot: slot, id: EngineID(slot, inc), addr: addr, transport: transport,
		consumer: Consumer(a.spec.Seed, slot, inc), stop: make(chan struct{}), done: make(chan struct{}),
	}
	if a.taken != nil {
		a.taken.begin(a.slotIdx[slot], inc)
	}
	opts := []notify.Option{notify.WithListenAddr(addr), notify.WithTransport(transport), notify.WithoutProcsReserve()}
	if q := RecvQueue(a.spec.Seed, slot, inc); q > 0 {
		opts = append(opts, notify.WithRecvQueue(q))
	}
	if a.spec.Provider != "" && transport == notify.TransportRDMATwoSided {
		opts = append(opts, notify.WithProvider(a.spec.Provider))
	}
	if ae.consumer == ConsumeHandler {
		if Answering(a.spec.Seed, slot, inc) {
			ae.ans = newAnswerer(ae)
		}
		opts = append(opts, notify.WithHandler(func(n notify.Notify) {
			ev := ae.take(n)
			if ae.ans != nil {
				ae.ans.answer(ev) // from inside the handler, before it returns
			}
			if us := ae.slowUS.Load(); us > 0 {
				time.Sleep(time.Duration(min(us, 5000)) * time.Microsecond) // a slow handler, bounded
			}
		}))
	}
	var err error
	// A restarted process may find its address still held for a moment by the kernel.
	for try := 0; ; try++ {
		ae.e, err = notify.New(opts...)
		if err == nil || try == 50 || a.ctx.Err() != nil {
			break
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-a.ctx.Done():
		}
	}
	if err != nil {
		return nil, fmt.Errorf("soak agent %d: engine %s on %s: %w", a.spec.Index, ae.id, addr, err)
	}
	go ae.consume()
	a.out.put(Event{K: KindUp, Eng: ae.id, Slot: slot, Addr: ae.e.Addr()})
	return ae, nil
}

// asyncOut is the count of stream k's SendNotifyAsync calls without a result.
func (a *agent) asyncOut(k streamKey) *atomic.Int32 {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := a.async[k]
	if n == nil {
		n = new(atomic.Int32)
		a.async[k] = n
	}
	return n
}

// stallPoll: how often a stall watch reads its engines' stats; stallHold: how long a
// channel must stay dry, at every poll, to be a stall (credit that was only on its way
// ends a dryness within a round trip; a full queue's does not end while it is full).
const (
	stallPoll = 25 * time.Millisecond
	stallHold = 300 * time.Millisecond
)

// watchStall looks, for up to d, for an engine of this agent whose async sends to slot
// (listening on addr) wait for credit on a channel with nothing in flight for stallHold,
// and says KindStalled once for the first it finds.
func (a *agent) watchStall(slot, addr string, d time.Duration) {
	names := []string{addr}
	if _, port, err := net.SplitHostPort(addr); err == nil && loopback(addr) {
		names = append(names, net.JoinHostPort("localhost", port))
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		end := time.Now().Add(d)
		since := map[string]time.Time{} // by engine: dry since, at every poll since
		t := time.NewTicker(stallPoll)
		defer t.Stop()
		for time.Now().Before(end) {
			select {
			case <-a.ctx.Done():
				return
			case <-t.C:
			}
			a.mu.Lock()
			var engines []*agentEngine
			for _, ae := range a.engines {
				if n := a.async[streamKey{from: ae.id, slot: slot}]; n != nil && n.Load() > 0 {
					engines = append(engines, ae)
				}
			}
			a.mu.Unlock()
			for _, ae := range engines {
				what, ok := stalledOn(ae.e.Stats(), names)
				if !ok {
					delete(since, ae.id)
					continue
				}
				if _, ok := since[ae.id]; !ok {
					since[ae.id] = time.Now()
				}
				if el := time.Since(since[ae.id]); el >= stallHold {
					a.out.put(Event{K: KindStalled, Eng: ae.id, Slot: slot, Err: fmt.Sprintf("%s, for %v", what, el.Round(time.Millisecond))})
					return
				}
			}
		}
	}()
}

// stalledOn reports whether st shows a channel to the engine at one of names stalled on
// credit: up, no credit but the one kept for credit frames, nothing in flight, sends
// waiting. Such a channel puts nothing on the wire, so no completion can fail: a peer
// killed now is found only by what needs no credit. what says what the channel showed.
func stalledOn(st notify.Stats, names []string) (what string, ok bool) {
	for _, p := range st.Peers {
		c := p.Channel
		if c == nil || p.State != "up" {
			continue
		}
		if !slices.Contains(names, p.Peer) && !slices.ContainsFunc(p.Names, func(n string) bool { return slices.Contains(names, n) }) {
			continue
		}
		if c.CreditAvail <= 1 && c.InFlight == 0 && c.Pending > 0 {
			return fmt.Sprintf("peer %s: credit %d, %d in flight, %d waiting", p.Peer, c.CreditAvail, c.InFlight, c.Pending), true
		}
	}
	return "", false
}

// leak is the leak plant: three times the goroutines there are, and some, waiting for the
// agent's end.
func (a *agent) leak(ctx context.Context) {
	n := 3*runtime.NumGoroutine() + 2*leakSlack
	for range n {
		go func() { <-ctx.Done() }()
	}
	a.log("plant: %d goroutines leaked", n)
}

// sample says what the process holds now.
func (a *agent) sample() *Res {
	r := &Res{Goroutines: runtime.NumGoroutine()}
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		r.FDs = len(ents)
	}
	if b, err := os.ReadFile("/proc/self/statm"); err == nil {
		var size, resident int64
		if _, err := fmt.Sscan(string(b), &size, &resident); err == nil {
			r.RSSKiB = resident * int64(os.Getpagesize()) / 1024
		}
	}
	a.mu.Lock()
	engines := make([]*agentEngine, 0, len(a.engines))
	for _, ae := range a.engines {
		engines = append(engines, ae)
	}
	a.mu.Unlock()
	for _, ae := range engines {
		st := ae.e.Stats()
		r.Peers += st.PeerCount
		r.Channels += st.ChannelsUp
	}
	return r
}

// consume takes notifies as the engine's consumer says, until stop.
func (ae *agentEngine) consume() {
	defer close(ae.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-ae.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		if till := ae.pauseTill.Load(); till > 0 {
			if d := time.Until(time.Unix(0, till)); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
					return
				}
			}
		}
		switch ae.consumer {
		case ConsumeHandler:
			<-ctx.Done()
			return
		case ConsumeRecv:
			n, err := ae.e.Recv(ctx)
			if err != nil {
				if ctx.Err() != nil || errors.Is(err, notify.ErrClosed) {
					return
				}
				ae.a.log("%s: Recv: %v", ae.id, err)
				continue
			}
			ae.take(n)
		case ConsumePoll:
			ns := ae.e.GetNotifies()
			for _, n := range ns {
				ae.take(n)
			}
			if len(ns) == 0 {
				select {
				case <-tick.C:
				case <-ctx.Done():
					return
				}
			}
		}
		if us := ae.slowUS.Load(); us > 0 && ae.consumer != ConsumeHandler {
			select {
			case <-time.After(time.Duration(us) * time.Microsecond):
			case <-ctx.Done():
				return
			}
		}
	}
}

// take reports one notify the application took, and returns its delivery event (none, K
// empty, for a hostile client's plain notify).
func (ae *agentEngine) take(n notify.Notify) Event {
	if strings.HasPrefix(n.Name, HostileClassicPrefix) {
		// A hostile client's plain Mooncake notify: the protocol delivers those (a peer
		// without twosided's extensions is trusted as Mooncake trusts it); not the soak's.
		ae.a.foreign.Add(1)
		return Event{}
	}
	ev := Event{K: KindDeliver, Eng: ae.id}
	from, s, p, size, answer, err := ParseNotifyName(n.Name)
	if err != nil {
		ev.Bad = err.Error()
		if len(ev.Bad) > 200 {
			ev.Bad = ev.Bad[:200]
		}
	} else {
		ev.From, ev.S, ev.P, ev.Answer = from, s, p, answer
		ev.Bad = CheckPayload(n.Msg, p, size)
	}
	ae.a.report(ev)
	return ev
}

// report hands a delivery to the parent, through the plant when one is set.
func (a *agent) report(ev Event) {
	if a.spec.Plant == "" || ev.Bad != "" {
		a.putDelivery(ev)
		return
	}
	a.plantMu.Lock()
	defer a.plantMu.Unlock()
	if h := a.held; h != nil && h.Eng == ev.Eng && h.From == ev.From && h.Answer == ev.Answer {
		a.held = nil
		a.putDelivery(ev)
		a.putDelivery(*h) // after a later call of its pair: reordered
		return
	}
	a.delivered++
	act := a.delivered == plantAt
	if a.spec.Plant == PlantLose {
		act = a.delivered%plantAt == 0 && a.delivered <= plantAt*plantLoses
	}
	if !act {
		a.putDelivery(ev)
		return
	}
	switch a.spec.Plant {
	case PlantLose:
		a.log("plant: lost %s's delivery of call %d (payload %d) from %s", ev.Eng, ev.S, ev.P, ev.From)
	case PlantDup:
		a.putDelivery(ev)
		a.putDelivery(ev)
		a.log("plant: duplicated %s's delivery of call %d (payload %d) from %s", ev.Eng, ev.S, ev.P, ev.From)
	case PlantReorder:
		a.held = &ev
		a.log("plant: holding %s's delivery of call %d (payload %d) from %s for its pair's next", ev.Eng, ev.S, ev.P, ev.From)
	default:
		a.putDelivery(ev)
	}
}

// putDelivery counts a delivery event, then queues it for the parent.
func (a *agent) putDelivery(ev Event) {
	if a.taken != nil {
		if slot, inc, err := ParseEngineID(ev.Eng); err == nil {
			if i, ok := a.slotIdx[slot]; ok {
				a.taken.put(i, inc)
			}
		}
	}
	a.out.put(ev)
}

// flushHeld reports a held delivery whose pair had no next one.
func (a *agent) flushHeld(eng string) {
	a.plantMu.Lock()
	defer a.plantMu.Unlock()
	if a.held != nil && a.held.Eng == eng {
		a.putDelivery(*a.held)
		a.held = nil
	}
}

// close closes ae cleanly and reports what it still held, then closed.
func (ae *agentEngine) close() {
	ae.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		w := ae.a.calls.add(ae.id, "", "Close", closeTimeout)
		err := ae.e.Close(ctx)
		ae.a.calls.done(w)
		if err != nil {
			ae.a.log("%s: Close: %v", ae.id, err)
		}
		close(ae.stop)
		<-ae.done
		for _, n := range ae.e.GetNotifies() { // what the queue held when Close returned
			ae.take(n)
		}
		if ae.ans != nil {
			ae.ans.closed()
		}
		ae.a.flushHeld(ae.id)
		ae.a.out.put(Event{K: KindClosed, Eng: ae.id})
	})
}

// reopen closes slot's engine mid-stream and opens incarnation inc on its address.
func (a *agent) reopen(slot string, inc int) {
	a.mu.Lock()
	ae := a.engines[slot]
	a.mu.Unlock()
	if ae == nil {
		return
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		ae.close()
		a.retireWorkers(ae.id)
		nae, err := a.open(slot, inc, ae.addr, ae.transport)
		if err != nil {
			a.log("%v", err)
			return
		}
		a.mu.Lock()
		a.engines[slot] = nae
		a.mu.Unlock()
	}()
}

// retireWorkers ends the stream workers of a closed engine: no operation reaches them
// again (op sends an old incarnation's operations nowhere), and a run that reopens engines
// often would otherwise keep a goroutine per stream of every incarnation it closed.
func (a *agent) retireWorkers(eng string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ae := a.engines[slotOf(eng)]; ae != nil && ae.id == eng {
		ae.retired = true
	}
	for k, ch := range a.workers {
		if k.from == eng {
			close(ch)
			delete(a.workers, k)
		}
	}
}

func slotOf(eng string) string {
	slot, _, _ := ParseEngineID(eng)
	return slot
}

// stopAll waits for the operations and reopens under way, then closes every engine at once.
func (a *agent) stopAll() {
	a.mu.Lock()
	for k, ch := range a.workers {
		close(ch)
		delete(a.workers, k)
	}
	a.mu.Unlock()
	a.wg.Wait()
	a.mu.Lock()
	all := make([]*agentEngine, 0, len(a.engines))
	for _, ae := range a.engines {
		all = append(all, ae)
	}
	a.mu.Unlock()
	var wg sync.WaitGroup
	for _, ae := range all {
		wg.Add(1)
		go func() { defer wg.Done(); ae.close() }()
	}
	wg.Wait()
}

// op queues an operation on its stream's worker: the calls of one stream are made in
// order, one operation after the other.
func (a *agent) op(ev Event) {
	slot, _, _ := ParseEngineID(ev.Eng)
	a.mu.Lock()
	defer a.mu.Unlock()
	ae := a.engines[slot]
	if ae == nil || ae.id != ev.Eng || ae.retired {
		// The engine was reopened meanwhile: nothing was called.
		a.out.put(Event{K: KindOpDone, Eng: ev.Eng, Slot: ev.Slot, Op: ev.Op})
		return
	}
	k := streamKey{from: ev.Eng, slot: ev.Slot}
	ch := a.workers[k]
	if ch == nil {
		ch = make(chan Event, 64)
		a.workers[k] = ch
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			w := &worker{a: a, ae: ae, to: ev.Slot}
			for op := range ch {
				w.run(op)
			}
		}()
	}
	select {
	case ch <- ev:
	default:
		a.log("%s -> %s: op %d dropped, the stream's queue is full", ev.Eng, ev.Slot, ev.Op)
		a.out.put(Event{K: KindOpDone, Eng: ev.Eng, Slot: ev.Slot, Op: ev.Op})
	}
}

// worker makes the calls of one stream.
type worker struct {
	a  *agent
	ae *agentEngine
	to string
	s  uint64
}

func (w *worker) notify(sd Send, s uint64) notify.Notify {
	msg := make([]byte, sd.Size)
	FillPayload(msg, sd.P)
	n := notify.Notify{Name: NotifyName(w.ae.id, s, sd.P, sd.Size), Msg: msg}
	if sd.ID {
		n.ID = fmt.Sprint(sd.P)
	}
	return n
}

func classOf(err error) string {
	switch {
	case err == nil:
		return ClassOK
	case errors.Is(err, notify.ErrMaybeDelivered):
		return ClassMaybe
	}
	return ClassFailed
}

func (w *worker) result(s uint64, sd Send, err error) Event {
	return resultEvent(w.ae.id, w.to, s, sd.P, err)
}

// resultEvent is the result of call s (payload p) of eng to slot.
func resultEvent(eng, slot string, s, p uint64, err error) Event {
	ev := Event{K: KindResult, Eng: eng, Slot: slot, S: s, P: p, Class: classOf(err)}
	if err != nil {
		ev.Err = err.Error()
		if len(ev.Err) > 1000 {
			ev.Err = ev.Err[:1000]
		}
	}
	return ev
}

func (w *worker) run(op Event) {
	defer w.a.out.put(Event{K: KindOpDone, Eng: w.ae.id, Slot: w.to, Op: op.Op})
	if op.Window <= 1 {
		for _, sd := range op.Sends {
			w.sync(op, sd, 0)
		}
		return
	}
	for i := 0; i < len(op.Sends); i += op.Window {
		w.window(op, op.Sends[i:min(i+op.Window, len(op.Sends))])
	}
}

// sync sends sd with SendNotify, and again with the same ID while the outcome is unknown
// and retries are left; each try is a call of its own.
func (w *worker) sync(op Event, sd Send, tries int) {
	for ; ; tries++ {
		w.s++
		s := w.s
		n := w.notify(sd, s)
		name := op.Names[(sd.Name+tries)%len(op.Names)]
		dl := time.Duration(max(sd.DeadlineMS, 1)) * time.Millisecond
		w.a.out.put(Event{K: KindStart, Eng: w.ae.id, Slot: w.to, Op: op.Op, S: s, P: sd.P})
		ctx, cancel := context.WithTimeout(w.a.ctx, dl)
		c := w.a.calls.add(w.ae.id, w.to, fmt.Sprintf("SendNotify call %d with a %v deadline", s, dl), dl)
		err := w.ae.e.SendNotify(ctx, name, n)
		w.a.calls.done(c)
		cancel()
		w.a.out.put(w.result(s, sd, err))
		if !errors.Is(err, notify.ErrMaybeDelivered) || !sd.ID || tries >= sd.Retries || w.a.ctx.Err() != nil {
			return
		}
	}
}

// window sends sds with SendNotifyAsync, all in flight at once, waits for every result,
// then retries the unknown ones with SendNotify.
func (w *worker) window(op Event, sds []Send) {
	var left atomic.Int32
	left.Store(int32(len(sds)))
	all := make(chan struct{})
	maybe := make([]atomic.Bool, len(sds))
	firsts := make([]atomic.Bool, len(sds))
	finish := func() {
		if left.Add(-1) == 0 {
			close(all)
		}
	}
	c := w.a.calls.add(w.ae.id, w.to, fmt.Sprintf("a window of %d SendNotifyAsync from call %d", len(sds), w.s+1), asyncBound)
	out := w.a.asyncOut(streamKey{from: w.ae.id, slot: w.to})
	out.Add(int32(len(sds)))
	for i, sd := range sds {
		w.s++
		s := w.s
		n := w.notify(sd, s)
		w.a.out.put(Event{K: KindStart, Eng: w.ae.id, Slot: w.to, Op: op.Op, S: s, P: sd.P})
		err := w.ae.e.SendNotifyAsync(op.Names[sd.Name%len(op.Names)], n, func(err error) {
			w.a.out.put(w.result(s, sd, err))
			if firsts[i].Swap(true) {
				return // a second result: reported, the checker counts it
			}
			maybe[i].Store(errors.Is(err, notify.ErrMaybeDelivered))
			out.Add(-1)
			finish()
		})
		if err != nil {
			w.a.out.put(w.result(s, sd, err))
			firsts[i].Store(true)
			out.Add(-1)
			finish()
		}
	}
	select {
	case <-all:
	case <-w.a.ctx.Done():
	}
	w.a.calls.done(c)
	for i, sd := range sds {
		if maybe[i].Load() && sd.ID && sd.Retries > 0 && w.a.ctx.Err() == nil {
			w.sync(op, sd, 1)
		}
	}
}

// callWatch reports a call or Close still running long after its bound.
type callWatch struct {
	mu   sync.Mutex
	next uint64
	m    map[uint64]*watched
}

type watched struct {
	eng, slot, what string
	answer          bool // a handler's answer: its hang is its answer stream's
	start           time.Time
	bound           time.Duration
	said            bool
}

func (cw *callWatch) add(eng, slot, what string, bound time.Duration) uint64 {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	if cw.m == nil {
		cw.m = map[uint64]*watched{}
	}
	cw.next++
	cw.m[cw.next] = &watched{eng: eng, slot: slot, what: what, start: time.Now(), bound: bound}
	return cw.next
}

// addAnswer is add for a handler's answer.
func (cw *callWatch) addAnswer(eng, slot, what string, bound time.Duration) uint64 {
	id := cw.add(eng, slot, what, bound)
	cw.mu.Lock()
	cw.m[id].answer = true
	cw.mu.Unlock()
	return id
}

func (cw *callWatch) done(id uint64) {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	delete(cw.m, id)
}

func (cw *callWatch) watch(ctx context.Context, out *outQueue) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cw.mu.Lock()
		for _, w := range cw.m {
			if el := time.Since(w.start); !w.said && el > w.bound+hangGrace {
				w.said = true
				out.put(Event{K: KindHang, Eng: w.eng, Slot: w.slot, Answer: w.answer, Err: fmt.Sprintf("%s still runs after %v", w.what, el.Round(time.Second))})
			}
		}
		cw.mu.Unlock()
	}
}

// outQueue writes events in the order they were put, never blocking the putter (a
// handler on a reactor thread puts too).
type outQueue struct {
	w      *bufio.Writer
	mu     sync.Mutex
	q      []Event
	wake   chan struct{}
	closed bool
	done   chan struct{}
}

func newOutQueue(w io.Writer) *outQueue {
	return &outQueue{w: bufio.NewWriterSize(w, 64<<10), wake: make(chan struct{}, 1), done: make(chan struct{})}
}

func (o *outQueue) put(ev Event) {
	o.mu.Lock()
	if !o.closed {
		o.q = append(o.q, ev)
	}
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

func (o *outQueue) run() {
	defer close(o.done)
	var batch []Event
	for {
		o.mu.Lock()
		batch, o.q = o.q, batch[:0]
		closed := o.closed
		o.mu.Unlock()
		for _, ev := range batch {
			_, _ = o.w.Write(Encode(ev))
		}
		if len(batch) == 0 {
			_ = o.w.Flush()
			if closed {
				return
			}
			<-o.wake
		}
	}
}

// close writes what is queued and stops.
func (o *outQueue) close() {
	o.mu.Lock()
	o.closed = true
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
	<-o.done
}

// ParseAgentSpec reads --spec.
func ParseAgentSpec(s string) (AgentSpec, error) {
	var spec AgentSpec
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&spec); err != nil {
		return spec, fmt.Errorf("--spec: %w", err)
	}
	if len(spec.Engines) == 0 {
		return spec, errors.New("--spec: no engines")
	}
	for _, e := range spec.Engines {
		if err := checkSlot(e.Slot); err != nil {
			return spec, fmt.Errorf("--spec: %w", err)
		}
	}
	return spec, nil
}
