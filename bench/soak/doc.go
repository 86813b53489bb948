// Package soak checks the delivery contract of package notify end to end, for as long as
// it is run: engines in several processes send to each other with a seeded mix of
// SendNotify, SendNotifyAsync windows, retries with the same Notify.ID, two names for one
// peer, sizes up to the limit and every consumer (Recv, WithHandler, GetNotifies; a handler
// may answer what it takes with SendNotifyAsync from inside itself, answer.go), while the
// processes are killed and restarted, stopped and continued, and engines closed mid-stream.
//
// Three parts, kept apart as in Jepsen or FoundationDB's simulation:
//
//   - the schedule (schedule.go): one seed gives each stream (a sender engine and a target
//     engine) and the fault injector the same sequence of operations on every run;
//   - the agents and the driver (agent.go, driver.go): the parent process starts agents (the
//     same binary, `twosided soak --agent`), tells them what to do over their stdin and reads
//     what happened on their stdout, one JSON event per line (event.go); agents use notify's
//     public API only;
//   - the checker (checker.go): a pure machine fed those events in the order the parent reads
//     them, with no I/O and no clock. It trusts only the history, never the engines' counters.
//
// What the checker requires (README "Delivery contract"): every send acknowledged (nil) is
// delivered to the target's application exactly once, and per (sender engine, receiver
// engine) pair in the order of the sender's calls; no notify whose send failed without
// ErrMaybeDelivered is delivered; a retry with the same Notify.ID is not delivered twice;
// payloads arrive intact; every call returns within its bound. The one allowance is the
// README's crash allowance: an acknowledged notify not delivered is allowed (and counted)
// only when an incarnation of its target that could have held it was killed with SIGKILL.
//
// Status: an internal layer of twosided, used by cmd/twosided's soak subcommand and its
// tests. It must not reach into the engine's internals.
package soak
