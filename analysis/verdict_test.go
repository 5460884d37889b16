package analysis

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/offcpu/offcpu/schema"
)

// offStack is an off-CPU stack from a folded line (thread;user;-;kernel)
// with its waker: relation-defining ids and the waker's folded stack.
func offStack(folded string, pid int64, process string, waker string, wakerPID int64, wakerProcess, class, wakerFolded string) *Stack {
	s := schema.FoldedStack(folded)
	s.Value, s.State, s.PID, s.Process = 1e9, "sleeping", pid, process
	s.Waker, s.WakerPID, s.WakerProcess, s.Class = waker, wakerPID, wakerProcess, class
	if waker != "" && !strings.HasPrefix(waker, "[") {
		s.WakerTID = wakerPID + 1
	}
	s.WakerFrames = schema.ParseWakerStack(wakerFolded)
	return &s
}

// The waker decides where the waiter's frame cannot: the same epoll_wait
// or condition wait is a lock wait when another session's lock release
// ended it, and idle when a client's next request or a hand-off of work
// did.
func TestVerdictsFromWakers(t *testing.T) {
	r, err := LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	epoll := "backend;main;ServerLoop;ProcSleep;WaitLatch;WaitEventSetWait;epoll_wait;-;do_epoll_wait;schedule"
	read := "backend;main;ServerLoop;ReadCommand;secure_read;WaitEventSetWait;epoll_wait;-;do_epoll_wait;schedule"
	for _, c := range []struct {
		name  string
		s     *Stack
		first string
		app   bool // counts as blocked time with an application frame
	}{
		{"lock wait in epoll, woken by a lock release of another process of the program", offStack(epoll, 10, "dbserver", "backend", 11, "dbserver", "other", "main;exec_simple_query;CommitTransaction;LockReleaseAll;ProcLockWakeup;SetLatch;kill;-;__x64_sys_kill;try_to_wake_up"), "monitor-wait", true},
		{"the same epoll_wait for the client's next query, woken by the client", offStack(read, 10, "dbserver", "client", 20, "loadgen", "pipe/socket", "main;send;-;tcp_sendmsg;sock_def_readable;try_to_wake_up"), "event-loop-idle", false},
		{"a condition wait of a row lock, woken by the holder's lock_release", offStack("conn;do_command;row_lock_wait;lock_wait;__GI___pthread_cond_timedwait;-;futex_wait;schedule", 10, "dbd", "conn", 10, "dbd", "futex", "do_command;trans_commit;trx_commit;lock_release;lock_grant;pthread_cond_signal;-;futex_wake;try_to_wake_up"), "monitor-wait", true},
		{"a socket read woken by another program", offStack("worker;serve;handle;recv;-;sk_wait_data;schedule", 10, "pyserver", "wrk", 30, "wrk", "pipe/socket", "main;write;-;tcp_sendmsg;try_to_wake_up"), "input-wait", false},
		{"a shell reading its pipe (6.18's anon_pipe_read)", offStack("sh;main;read;-;anon_pipe_read;schedule", 40, "sh", "cat", 41, "cat", "pipe/socket", "main;write;-;anon_pipe_write;try_to_wake_up"), "input-wait", false},
		{"an idle pool worker woken by a submit (which also unlocks)", offStack("pool-1-thread-1;java.lang.Thread.run;java.util.concurrent.ThreadPoolExecutor.getTask;java.util.concurrent.LinkedBlockingQueue.take;jdk.internal.misc.Unsafe.park;__pthread_cond_wait;-;futex_wait", 50, "java", "main", 50, "java", "futex", "Juc.main;java.util.concurrent.ThreadPoolExecutor.execute;java.util.concurrent.LinkedBlockingQueue.offer;java.util.concurrent.LinkedBlockingQueue.signalNotEmpty;java.util.concurrent.locks.ReentrantLock.unlock;java.util.concurrent.locks.AbstractQueuedSynchronizer.release;jdk.internal.misc.Unsafe.unpark;pthread_cond_signal;-;futex_wake"), "queue-wait", false},
		{"a ReentrantLock waiter woken by unlock", offStack("locker-1;Juc.holdLock;java.util.concurrent.locks.ReentrantLock.lock;java.util.concurrent.locks.AbstractQueuedSynchronizer.acquire;jdk.internal.misc.Unsafe.park;__pthread_cond_wait;-;futex_wait", 50, "java", "locker-2", 50, "java", "futex", "Juc.holdLock;java.util.concurrent.locks.ReentrantLock.unlock;java.util.concurrent.locks.AbstractQueuedSynchronizer.release;jdk.internal.misc.Unsafe.unpark;pthread_cond_signal;-;futex_wake"), "monitor-wait", true},
		{"a condition wait ended by a block I/O completion", offStack("flusher;log_flush;wait_io;pthread_cond_wait;-;futex_wait;schedule", 60, "dbd", "[softirq]", 0, "", "block-io", "-;try_to_wake_up;end_buffer_write_sync;blk_done_softirq"), "io", true},
		{"an event loop woken by an eventfd after a task submit", offStack("loop-1;run;epoll_wait;-;do_epoll_wait", 70, "srv", "worker", 70, "srv", "eventfd", "submit;eventfd_write;-;eventfd_write;try_to_wake_up"), "event-loop-idle", false},
		{"an old profile: no waker process recorded", offStack("worker;serve;handle;recv;-;sk_wait_data;schedule", 10, "pyserver", "wrk", 0, "", "pipe/socket", ""), "io", true},
	} {
		cs := r.Categorize(c.s)
		if cs[0] != c.first || r.AppBlocked(c.s) != c.app {
			t.Errorf("%s: categories %v, blocked with an app frame %v; want %s first, %v\n%s", c.name, cs, r.AppBlocked(c.s), c.first, c.app, strings.Join(r.Explain(c.s), "\n"))
		}
	}
	// --explain names both sides.
	ex := strings.Join(r.Explain(offStack(epoll, 10, "dbserver", "backend", 11, "dbserver", "other", "main;LockReleaseAll;SetLatch;kill;-;try_to_wake_up")), "\n")
	for _, want := range []string{"event-loop-idle", "waker: backend (same-program", "LockReleaseAll", "the waker wins"} {
		if !strings.Contains(ex, want) {
			t.Errorf("--explain lacks %q:\n%s", want, ex)
		}
	}
}

// Rules match glibc's internal names, GCC's clone suffixes and kernel
// functions renamed across releases as the names they were written for.
func TestNormalizedFrameNames(t *testing.T) {
	for in, want := range map[string]string{
		"__GI___pthread_cond_timedwait":  "__pthread_cond_timedwait",
		"__libc_recv":                    "recv",
		"pthread_cond_wait@@GLIBC_2.3.2": "pthread_cond_wait",
		"tcp_sendmsg_locked.isra.0":      "tcp_sendmsg_locked",
		"do_sys_poll.constprop.0.cold":   "do_sys_poll",
		"anon_pipe_read":                 "pipe_read",
		"epoll_wait":                     "epoll_wait",
	} {
		if got := NormalizeFrame(in); got != want {
			t.Errorf("NormalizeFrame(%q) = %q, want %q", in, got, want)
		}
	}
	r, _ := LoadRules("")
	for folded, want := range map[string]string{
		"t;main;__GI___pthread_cond_timedwait;-;futex_wait": "queue-wait",
		"t;main;__GI___poll;-;do_sys_poll.constprop.0":      "event-loop-idle",
		"t;main;read;-;anon_pipe_read":                      "io",
	} {
		s := schema.FoldedStack(folded)
		s.Value = 1
		if cs := r.Categorize(&s); cs[0] != want {
			t.Errorf("%s: %v, want %s first", folded, cs, want)
		}
	}
}

// A rules file extends the built-in rules unless it says it replaces
// them; a rule of its that never matched is reported.
func TestRulesFileExtends(t *testing.T) {
	dir := t.TempDir()
	ext := filepath.Join(dir, "ext.yaml")
	os.WriteFile(ext, []byte(`categories:
  - name: row-lock
    description: InnoDB-style row lock waits
rules:
  - category: row-lock
    frames: ['^lock_wait$']
  - category: row-lock
    frames: ['^lock_wiat$'] # misspelled: never matches
`), 0o644)
	r, err := LoadRules(ext)
	if err != nil {
		t.Fatal(err)
	}
	s := schema.FoldedStack("conn;do_command;lock_wait;pthread_cond_wait;-;futex_wait")
	s.Value = 1
	if cs := r.Categorize(&s); cs[0] != "row-lock" || !slices.Contains(cs, "queue-wait") {
		t.Errorf("extended rules: %v, want row-lock first and the built-in queue-wait too", cs)
	}
	pre := schema.FoldedStack("t;main;f;-;schedule")
	pre.Value, pre.State = 1, "preempted"
	if cs := r.Categorize(&pre); cs[0] != "runqueue" {
		t.Errorf("extended rules lost the built-in runqueue rule: %v", cs)
	}
	if un := r.UnmatchedRules(); len(un) != 1 || !strings.Contains(un[0], "ext.yaml:7") {
		t.Errorf("unmatched rules %v, want the misspelled one at ext.yaml:7", un)
	}
	rep := filepath.Join(dir, "rep.yaml")
	os.WriteFile(rep, []byte("replace: true\ncategories:\n  - name: row-lock\nrules:\n  - category: row-lock\n    frames: ['^lock_wait$']\n"), 0o644)
	if r, err = LoadRules(rep); err != nil {
		t.Fatal(err)
	}
	if cs := r.Categorize(&pre); cs[0] != "other" {
		t.Errorf("replacing rules kept the built-in ones: %v", cs)
	}
}

// Threads that serve another program are found from the profile itself:
// a session's wait away from its input wait, woken by another session
// deep in a request, is inside a request (peer-wait, blocked); the same
// wait of a pooled thread, woken by a listener a call from its own input
// wait, is a hand-off (idle).
func TestServingThreads(t *testing.T) {
	r, _ := LoadRules("")
	mk := func(tid int64, folded string, wakerTID int64, wakerProcess, class, wakerFolded string) Stack {
		s := *offStack(folded, 1, "srv", "t", 1, wakerProcess, class, wakerFolded)
		s.TID, s.WakerTID = tid, wakerTID
		if wakerProcess != "srv" {
			s.WakerPID = 2
		}
		return s
	}
	input := "t;main;loop;serve;read_request;poll;-;do_sys_poll"
	listen := "t;main;accept_loop;poll;-;do_sys_poll"
	stacks := []Stack{
		mk(10, input, 99, "client", "pipe/socket", "main;send;-;tcp_sendmsg"),
		mk(11, input, 99, "client", "pipe/socket", "main;send;-;tcp_sendmsg"),
		mk(1, listen, 99, "client", "pipe/socket", "main;connect;-;tcp_v4_connect"),
		// 10 waits on a row lock 11 releases at commit.
		mk(10, "t;main;loop;serve;execute;lock_row;pthread_cond_wait;-;futex_wait", 11, "srv", "futex", "main;loop;serve;execute;commit;grant_locks;pthread_cond_signal;-;futex_wake"),
		// 11 waits in the thread cache; the listener hands it a connection.
		mk(11, "t;main;loop;cache_wait;pthread_cond_wait;-;futex_wait", 1, "srv", "futex", "main;accept_loop;pthread_cond_signal;-;futex_wake"),
	}
	schema.MarkInRequest(stacks)
	for i, want := range []string{"event-loop-idle", "event-loop-idle", "event-loop-idle", "peer-wait", "queue-wait"} {
		if cs := r.Categorize(&stacks[i]); cs[0] != want {
			t.Errorf("stack %d (%s): %v (in request %v, waker dispatching %v), want %s first", i, stacks[i].Folded(), cs, stacks[i].InRequest, stacks[i].WakerDispatching, want)
		}
	}
}

// The report says what the blocked threads waited on: the waker's group
// and the frame its verdict found (else its innermost named application
// frame).
func TestBlockedOnStatement(t *testing.T) {
	r, _ := LoadRules("")
	s := offStack("backend;main;exec_query;ProcSleep;WaitLatch;epoll_wait;-;do_epoll_wait", 10, "dbserver", "backend", 11, "dbserver", "other",
		"main;exec_query;CommitTransaction;LockReleaseAll;ProcLockWakeup;SetLatch;kill;-;try_to_wake_up")
	s.Count = 1
	rep := Analyze(&Data{Stacks: []Stack{*s}}, r, Options{Top: 10})
	want := "backend threads blocked 1.00 s in monitor-wait, woken by backend threads in LockReleaseAll"
	if !slices.ContainsFunc(rep.Statements, func(st string) bool { return strings.HasPrefix(st, want) }) {
		t.Errorf("statements %q lack %q", rep.Statements, want)
	}
}
