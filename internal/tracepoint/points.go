// Package tracepoint stamps the steps of a notify's path on one clock, for the segment
// profile of docs/design.md (where the time of a round trip goes, step by step, in both
// processes). Built without the tracepoints tag, Mark is an empty function the compiler
// drops: the stamps cost nothing. Built with it (go build -tags tracepoints), each Mark
// appends (CLOCK_MONOTONIC ns, point, argument) to a process-wide buffer, and Dump writes
// the buffer out; `go run ./bench/segments` reads such files and prints, for each pair of
// points that follow each other in a process, the median and p90 of the time between them.
package tracepoint

import "strconv"

// Point names a step on a notify's path.
type Point uint8

// The points. Their numbers are what a dump holds; new ones go at the end.
const (
	_             Point = iota
	LoopWoke            // the loop thread's epoll_wait returned (argument: events)
	CallerWoke          // a borrowed turn's epoll_wait returned (ExecWait, Poll; argument: events)
	ReadStart           // an OOB connection's read(2) begins
	ReadEnd             // it returned (argument: bytes, or -1)
	Handle              // an OOB notify request decoded, handed to the Handler
	AckSend             // the Handler's reply (the ACK) sent
	RunQueue            // the loop runs its queue of submitted funcs
	Flush               // the turn's batches are written (oob.Node.flushBatches)
	WriteStart          // an OOB connection's write(2) begins (argument: bytes)
	WriteEnd            // it returned (argument: bytes, or -1)
	SleepLoop           // the loop thread calls a blocking epoll_wait (argument: timeout ms)
	SleepOuter          // the loop thread blocks on its outer set
	SleepCaller         // a borrowed turn calls a blocking epoll_wait (argument: timeout ms)
	SendRun             // the loop side of a send begins (the engine's machine)
	SendOOB             // the machine's action reaches the OOB node
	CallStart           // the OOB call is encoded and queued on its connection
	CallQueued          // done
	Submit              // bench: the sender's clock starts for a notify (argument: sequence number)
	Deliver             // bench: a notify reached the application's handler
	HandlerDone         // bench: the handler returned (its echo, if any, was sent)
	ChannelEvents       // the loop read an event from a completion channel (one stamp per event)
	CQPoll              // a CQ's completions are handed to its handler (argument: work completions)
	PostSendStart       // a ctrl channel posts its turn's SENDs (argument: work requests)
	PostSendEnd         // the post returned
	numPoints
)

var names = [numPoints]string{"", "loop-woke", "caller-woke", "read>", "read<", "handle", "ack-send",
	"run-queue", "flush", "write>", "write<", "sleep-loop", "sleep-outer", "sleep-caller",
	"send-run", "send-oob", "call-start", "call-queued", "submit", "deliver", "handler-done",
	"channel-events", "cq-poll", "post-send>", "post-send<"}

// String is the point's name as the segment table prints it.
func (p Point) String() string {
	if p < numPoints {
		return names[p]
	}
	return "point-" + strconv.Itoa(int(p))
}
