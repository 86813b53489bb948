package notify_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/twosided/twosided/notify"
)

// closeEngine closes e within its own bound, as every program should: Close drains what
// the channels' NICs acknowledged, tells the peers goodbye and stops the reactor.
func closeEngine(e *notify.Engine) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Close(ctx); err != nil {
		log.Print("close: ", err)
	}
}

// A complete small program: two engines (in real use, one per process), a receive loop,
// sends that retry with the same Notify.ID while the outcome is unknown, an errors.Is
// branch on the result, and Close within a deadline. The README shows it as package main.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// Each engine's peer name is its listener's host:port (recv.Addr()).
	recv, err := notify.New(notify.WithListenAddr("127.0.0.1:0"), notify.WithTransport(notify.TransportRDMATwoSided))
	if err != nil {
		log.Fatal(err)
	}
	send, err := notify.New(notify.WithListenAddr("127.0.0.1:0"), notify.WithTransport(notify.TransportRDMATwoSided))
	if err != nil {
		log.Fatal(err)
	}

	// The receive loop (or notify.WithHandler, called on the engine's reactor thread).
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 3; i++ {
			n, err := recv.Recv(ctx)
			if err != nil {
				log.Print("recv: ", err)
				return
			}
			fmt.Printf("%s %s\n", n.Name, n.Msg)
		}
	}()

	for i := 1; i <= 3; i++ {
		n := notify.Notify{Name: "kv_ready", Msg: fmt.Appendf(nil, "req-%d", i), ID: fmt.Sprintf("req-%d", i)}
		err := sendOnce(ctx, send, recv.Addr(), n)
		switch {
		case err == nil: // the peer engine has it; it delivers it once, in order
		case errors.Is(err, notify.ErrMaybeDelivered):
			log.Fatal("outcome still unknown at the deadline: ", err)
		case errors.Is(err, notify.ErrBackpressure):
			log.Fatal("the peer is not consuming; not delivered: ", err)
		default:
			log.Fatal("not delivered: ", err)
		}
	}
	<-done

	// Close within a deadline: what the NICs acknowledged is delivered, peers are told.
	closeCtx, cancelClose := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelClose()
	for _, e := range []*notify.Engine{send, recv} {
		if err := e.Close(closeCtx); err != nil {
			log.Print("close: ", err)
		}
	}
	// Output:
	// kv_ready req-1
	// kv_ready req-2
	// kv_ready req-3
}

// SendNotifyAsync never blocks: it queues the notify and calls done once, on the engine's
// reactor thread, with the result SendNotify would have returned. done must not block.
func ExampleEngine_SendNotifyAsync() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	recv, err := notify.New(notify.WithListenAddr("127.0.0.1:0"), notify.WithTransport(notify.TransportRDMATwoSided))
	if err != nil {
		log.Fatal(err)
	}
	defer closeEngine(recv)
	send, err := notify.New(notify.WithListenAddr("127.0.0.1:0"), notify.WithTransport(notify.TransportRDMATwoSided))
	if err != nil {
		log.Fatal(err)
	}
	defer closeEngine(send)

	const count = 3
	results := make(chan error, count) // room for every result: done never blocks
	for i := 1; i <= count; i++ {
		n := notify.Notify{Name: "kv_ready", Msg: fmt.Appendf(nil, "req-%d", i)}
		if err := send.SendNotifyAsync(recv.Addr(), n, func(err error) { results <- err }); err != nil {
			log.Fatal(err) // refused at once (bad argument, closed engine, backpressure)
		}
	}
	for i := 0; i < count; i++ {
		if err := <-results; err != nil {
			log.Fatal(err)
		}
	}
	// Per-peer FIFO: the receiver gets them in send order.
	for i := 0; i < count; i++ {
		n, err := recv.Recv(ctx)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(string(n.Msg))
	}
	// Output:
	// req-1
	// req-2
	// req-3
}

// WithHandler delivers each notify by calling the handler on the engine's reactor thread
// (the lowest-latency path) instead of queueing it for Recv. The handler must not block;
// it may answer with SendNotifyAsync, which never blocks.
func ExampleWithHandler() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	got := make(chan string, 1)
	recv, err := notify.New(
		notify.WithListenAddr("127.0.0.1:0"),
		notify.WithTransport(notify.TransportRDMATwoSided),
		notify.WithHandler(func(n notify.Notify) {
			select {
			case got <- n.Name + " " + string(n.Msg): // copy what outlives the call
			default: // never block the reactor
			}
		}),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer closeEngine(recv)
	send, err := notify.New(notify.WithListenAddr("127.0.0.1:0"), notify.WithTransport(notify.TransportRDMATwoSided))
	if err != nil {
		log.Fatal(err)
	}
	defer closeEngine(send)

	if err := send.SendNotify(ctx, recv.Addr(), notify.Notify{Name: "kv_ready", Msg: []byte("req-7")}); err != nil {
		log.Fatal(err)
	}
	select {
	case s := <-got:
		fmt.Println(s)
	case <-ctx.Done():
		log.Fatal("no notify")
	}
	// Output: kv_ready req-7
}

// sendOnce sends n, and sends it again with the same Notify.ID while the outcome is
// unknown (an error wrapping ErrMaybeDelivered): the receiver delivers it at most once.
func sendOnce(ctx context.Context, e *notify.Engine, peer string, n notify.Notify) error {
	for {
		err := e.SendNotify(ctx, peer, n)
		if !errors.Is(err, notify.ErrMaybeDelivered) || ctx.Err() != nil {
			return err // nil: delivered; any other error: not delivered
		}
		log.Print("outcome unknown, sending again with the same ID: ", err)
	}
}

// A retry with the same Notify.ID is never delivered twice: the receiver drops an id it
// delivered recently in that pair (the last 256). Here the second send stands for a retry
// after an ErrMaybeDelivered whose first try did land; the receiver sees it once.
func ExampleNotify_retry() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	recv, err := notify.New(notify.WithListenAddr("127.0.0.1:0"), notify.WithTransport(notify.TransportRDMATwoSided))
	if err != nil {
		log.Fatal(err)
	}
	defer closeEngine(recv)
	send, err := notify.New(notify.WithListenAddr("127.0.0.1:0"), notify.WithTransport(notify.TransportRDMATwoSided))
	if err != nil {
		log.Fatal(err)
	}
	defer closeEngine(send)

	n := notify.Notify{Name: "kv_ready", Msg: []byte("req-42"), ID: "req-42/kv_ready"}
	if err := sendOnce(ctx, send, recv.Addr(), n); err != nil {
		log.Fatal(err)
	}
	if err := sendOnce(ctx, send, recv.Addr(), n); err != nil { // the "retry": same ID
		log.Fatal(err)
	}
	if err := sendOnce(ctx, send, recv.Addr(), notify.Notify{Name: "kv_done", Msg: []byte("req-42"), ID: "req-42/kv_done"}); err != nil {
		log.Fatal(err)
	}
	// Per-peer FIFO: had the duplicate been delivered, it would come before kv_done.
	for i := 0; i < 2; i++ {
		got, err := recv.Recv(ctx)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(got.Name, string(got.Msg))
	}
	// Output:
	// kv_ready req-42
	// kv_done req-42
}
