package analysis

import (
	"strings"
	"testing"

	"github.com/offcpu/offcpu/schema"
)

// waits is n waits of one stack by one thread (tid) or goroutine (goid).
// A goroutine's Thread (its start function) is the folded line's first
// field.
func waits(folded string, tid, goid, n int64, waker string, wakerPID int64, wakerProcess, class, reason string) Stack {
	s := schema.FoldedStack(folded)
	s.Value, s.Count, s.State, s.PID, s.Process, s.TID, s.Goid, s.Reason = n*1e6, n, "sleeping", 10, "srv", tid, goid, reason
	s.Waker, s.WakerPID, s.WakerProcess, s.Class = waker, wakerPID, wakerProcess, class
	if waker != "" && !strings.HasPrefix(waker, "[") {
		s.WakerTID = wakerPID + 1
	}
	return s
}

// Each thread's top of loop comes from its own waits: the recurring wait
// that no other encloses, a server's outermost wait for input; what is
// beneath it is blocked whatever ended it, what is at it idle.
func TestLoopTops(t *testing.T) {
	r, err := LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	stacks := []Stack{
		// A loop goroutine kicked through a channel by request goroutines;
		// each round it calls a downstream over the network.
		waits("main.loop;runtime.goexit;main.loop;runtime.selectgo;runtime.gopark", 0, 7, 500, "net/http.(*conn).serve", 10, "srv", "", "select"),
		waits("main.loop;runtime.goexit;main.loop;main.round;bufio.(*Reader).ReadString;net.(*conn).Read;internal/poll.(*FD).Read;runtime.gopark", 0, 7, 900, "[scheduler]", 0, "", "", "IO wait"),
		// An event loop whose handler reads a pipe synchronously: the
		// writer is another program, as the loop's clients are.
		waits("node;main;uv_run;uv__io_poll;epoll_wait;-;do_epoll_wait", 20, 0, 300, "client", 30, "load", "pipe/socket", ""),
		waits("node;main;uv_run;uv__io_poll;uv__stream_io;onRead;handler;readSync;uv_fs_read;read;-;pipe_read", 20, 0, 100, "writer", 40, "writer", "pipe/socket", ""),
		// A supervisor sleeping in select with a timeout: no input at all.
		waits("arbiter;main;Arbiter.run;Arbiter.sleep;select;-;core_sys_select;do_select", 50, 0, 5, "[timer]", 0, "", "timer", ""),
		// A server thread: its read of the next request is its top; a row
		// lock elsewhere in its code is inside a request.
		waits("conn;main;handle_connection;do_command;net_read;poll;-;do_sys_poll", 60, 0, 200, "client", 30, "load", "pipe/socket", ""),
		waits("conn;main;handle_connection;do_command;dispatch;row_lock;pthread_cond_wait;-;futex_wait", 60, 0, 50, "conn", 60, "srv", "futex", ""),
		// The same thread's wait in its thread cache, between
		// connections: an outer loop's, enclosing the top.
		waits("conn;main;handle_connection;pthread_cond_timedwait;-;futex_wait", 60, 0, 1, "", 0, "", "", ""),
		// One-shot goroutines, each waiting once: no loop.
		waits("query.func1;runtime.goexit;query.func1;sync.(*WaitGroup).Wait;runtime.gopark", 0, 100, 1, "query.func2", 10, "srv", "", "sync.WaitGroup.Wait"),
		waits("query.func1;runtime.goexit;query.func1;sync.(*WaitGroup).Wait;runtime.gopark", 0, 101, 1, "query.func2", 10, "srv", "", "sync.WaitGroup.Wait"),
		// A Go thread with no goroutine to run: the runtime's own wait.
		waits("srv;runtime.mcall;runtime.schedule;runtime.findRunnable;runtime.stopm;runtime.futex;-;futex_wait", 70, 0, 100, "srv", 70, "srv", "futex", ""),
		waits("srv;runtime.mcall;runtime.findRunnable;runtime.netpoll;epoll_wait;-;do_epoll_wait", 70, 0, 100, "[net-rx]", 0, "", "net-rx", ""),
	}
	for i := range stacks {
		stacks[i].InRequest = true // what MarkInRequest may have guessed: the places decide
	}
	Judge(stacks, r)
	for _, c := range []struct {
		i     int
		loop  string
		first string
	}{
		{0, schema.LoopTop, "queue-wait"},
		{1, schema.LoopBeneath, "downstream-wait"},
		{2, schema.LoopTop, "event-loop-idle"},
		{3, schema.LoopBeneath, "io"},
		{4, schema.LoopTop, "event-loop-idle"},
		{5, schema.LoopTop, "event-loop-idle"},
		{6, schema.LoopBeneath, "peer-wait"},
		{7, schema.LoopTop, "queue-wait"},
		{8, "", "join-wait"},
		{10, "", "runtime"},
		{11, "", "event-loop-idle"},
	} {
		s := &stacks[c.i]
		if cs := r.Categorize(s); s.Loop != c.loop || cs[0] != c.first {
			t.Errorf("%s: loop %q, categories %v; want %q, %s first\n%s", s.Folded(), s.Loop, cs, c.loop, c.first, strings.Join(r.Explain(s), "\n"))
		}
	}
	// --explain names the top and why.
	ex := strings.Join(r.Explain(&stacks[1]), "\n")
	if !strings.Contains(ex, "beneath its thread's top of loop, main.loop (500 waits") {
		t.Errorf("explain does not name the top:\n%s", ex)
	}
	// A waker's release still makes a top blocked: a loop whose top is a
	// lock its peers hold.
	lock := waits("locker;main;worker;pthread_mutex_lock;__lll_lock_wait;-;futex_wait", 80, 0, 100, "locker", 80, "srv", "futex", "")
	lock.WakerFrames = schema.ParseWakerStack("main;worker;pthread_mutex_unlock;-;futex_wake")
	one := []Stack{lock}
	Judge(one, r)
	if cs := r.Categorize(&one[0]); one[0].Loop != schema.LoopTop || cs[0] != "monitor-wait" {
		t.Errorf("a lock at a loop's top: loop %q, categories %v; want top, monitor-wait first", one[0].Loop, cs)
	}
}

// Goroutines of one start function loop as one where they share a site
// (a pool of connection goroutines: one that served a single request has
// the pool's top), and apart where they do not (a wrapper that starts
// unrelated loops).
func TestLoopPools(t *testing.T) {
	r, err := LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	read := "net/http.(*conn).serve;runtime.goexit;net/http.(*conn).serve;net/http.(*connReader).Read;net.(*conn).Read;internal/poll.(*FD).Read;runtime.gopark"
	handler := "net/http.(*conn).serve;runtime.goexit;net/http.(*conn).serve;net/http.serverHandler.ServeHTTP;main.query;runtime.chanrecv1;runtime.gopark"
	stacks := []Stack{
		waits(read, 0, 1, 50, "[scheduler]", 0, "", "", "IO wait"),
		waits(handler, 0, 1, 10, "main.worker", 10, "srv", "", "chan receive"),
		waits(read, 0, 2, 40, "[scheduler]", 0, "", "", "IO wait"),
		// One request, whose read did not wait, and a handler that waits
		// twice: the pool's top decides.
		waits(handler, 0, 3, 2, "main.worker", 10, "srv", "", "chan receive"),
		// A wrapper's goroutines: a network client and a channel loop.
		waits("main.main.func1;runtime.goexit;main.main.func1;main.netClient;net.(*conn).Read;internal/poll.(*FD).Read;runtime.gopark", 0, 20, 300, "[scheduler]", 0, "", "", "IO wait"),
		waits("main.main.func1;runtime.goexit;main.main.func1;main.chanRecv;runtime.chanrecv2;runtime.gopark", 0, 21, 200, "main.main.func1", 10, "srv", "", "chan receive"),
	}
	Judge(stacks, r)
	for _, c := range []struct {
		i     int
		loop  string
		first string
	}{
		{1, schema.LoopBeneath, "peer-wait"},
		{3, schema.LoopBeneath, "peer-wait"},
		{4, schema.LoopTop, "input-wait"},
		{5, schema.LoopTop, "queue-wait"},
	} {
		s := &stacks[c.i]
		if cs := r.Categorize(s); s.Loop != c.loop || cs[0] != c.first {
			t.Errorf("goroutine %d %s: loop %q, categories %v; want %q, %s first\n%s", s.Goid, s.Folded(), s.Loop, cs, c.loop, c.first, strings.Join(r.Explain(s), "\n"))
		}
	}
}
