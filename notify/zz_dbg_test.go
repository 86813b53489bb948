package notify

import (
	"strconv"
	"testing"
	"fmt"
	"time"
)

func TestDbg149(t *testing.T) {
	n := newSimNet(t, 149)
	a := n.add("a", 10, simCfg())
	b := n.add("b", 20, simCfg())
	for _, e := range []*simEngine{a, b} {
		e := e
		e.trace = func(x mAction) {
			if x.kind != aDeliver && x.kind != aComplete && x.kind != aTimer {
				fmt.Printf("%s %v: kind=%d ch=%d epoch=%d name=%s err=%v seq=%d req=%d\n", e.name, n.now.Sub(time.Unix(1000,0)), x.kind, x.ch, x.epoch, x.name, x.err, x.seq, x.req)
			}
		}
	}
	for i := 0; i < 30; i++ {
		a.send("b", "a"+strconv.Itoa(i), "")
		b.send("a", "b"+strconv.Itoa(i), "")
	}
	n.run()
	for _, e := range []*simEngine{a, b} {
		fmt.Println(e.name, "channels", e.m.channels, "got", len(e.got))
		for k, p := range e.m.peers {
			fmt.Printf("  peer %v ch=%d mode=%d names=%v waiters=%d inflight=%d\n", k, p.ch, p.mode, p.names, len(p.waiters), p.inflight)
		}
		fmt.Printf("  stats %+v\n", e.m.stats)
	}
}
