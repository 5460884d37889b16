// Package dispatcher is offcpu's bundled workload: a Go model of Apache
// Pulsar's broker dispatch paths and client pools (what it models and
// from which upstream classes: ../README.md), with a baseline and a
// candidate variant of each change the seeds describe (../seeds.md).
//
// The broker (broker.go) runs Netty-style epoll event loops
// (eventloop.go) over Unix socket pairs speaking a small binary protocol
// (protocol.go); executors (conn.go) stand for the managed-ledger
// executor and topic workers; each subscription's dispatcher
// (dispatcher.go, selector.go for Key_Shared) reads entries from an
// in-memory ledger (ledger.go) under the dispatcher monitor (sync.go) and
// sends them under flow control; throttle.go is the broker's publish
// throttling. The client (client.go, listener.go, multitopic.go) models
// the Java client's IO threads, listener pools and multi-topic consumer.
// Every thread Pulsar runs is an OS thread here, named as Pulsar names it,
// so that off-CPU profiles read as the broker's would. Run (run.go) runs a
// Scenario (scenario.go) with one variant (variant.go), watching its
// deliveries and CPU (watch.go), and verifies every delivery in its
// Result (result.go).
package dispatcher
