package dispatcher

import (
	"os"
	"time"

	"github.com/prometheus/procfs"
)

// cpuTimes are CPU seconds of thread groups.
type cpuTimes struct{ broker, pools, app, total float64 }

// threadCPU returns the CPU seconds of this process's broker threads,
// listener pools and consumer application (alive for the whole run;
// schedstat, in ns) and of the whole process, from /proc/self/stat, which
// keeps the time of threads that have exited (producers end when they
// are done).
func threadCPU() (ct cpuTimes) {
	if p, err := procfs.Self(); err == nil {
		if st, err := p.Stat(); err == nil {
			ct.total = st.CPUTime()
		}
	}
	threads, err := procfs.AllThreads(os.Getpid())
	if err != nil {
		return ct
	}
	for _, t := range threads {
		comm, err := t.Comm()
		if err != nil {
			continue
		}
		st, err := t.Schedstat()
		if err != nil {
			continue
		}
		s := float64(st.RunningNanoseconds) / 1e9
		if IsBrokerThread(comm) {
			ct.broker += s
		}
		if listenerThreads.MatchString(comm) {
			ct.pools += s
		}
		if appThreads.MatchString(comm) {
			ct.app += s
		}
	}
	return ct
}

func (a cpuTimes) sub(b cpuTimes) cpuTimes {
	return cpuTimes{a.broker - b.broker, a.pools - b.pools, a.app - b.app, a.total - b.total}
}

// deliveryClock samples each subscription's deliveries over time, for
// the consume rates.
type deliveryClock struct {
	at     []int64   // unix ns
	counts [][]int64 // per sample, per subscription
	done   chan struct{}
}

func watchDeliveries(cl *Client, stop <-chan struct{}) *deliveryClock {
	dc := &deliveryClock{done: make(chan struct{})}
	sample := func() bool {
		n := make([]int64, len(cl.subs))
		for i, s := range cl.subs {
			n[i] = s.distinct.Load()
		}
		dc.at, dc.counts = append(dc.at, time.Now().UnixNano()), append(dc.counts, n)
		return true
	}
	go func() {
		defer close(dc.done)
		every(10*time.Millisecond, stop, sample)
		sample() // the last deliveries can come after the last tick
	}()
	return dc
}

// rate is subscription sub's msg/s from the sample where it had a fifth
// of its final deliveries to the first where it had them all (10 ms
// samples: no clock read per delivery).
func (dc *deliveryClock) rate(sub int, final int64) float64 {
	from := -1
	for i, n := range dc.counts {
		if from < 0 && n[sub] >= final/5 {
			from = i
		}
		if n[sub] >= final {
			if d := float64(dc.at[i]-dc.at[max(from, 0)]) / 1e9; from >= 0 && d > 0 && final > dc.counts[from][sub] {
				return float64(final-dc.counts[from][sub]) / d
			}
			return 0
		}
	}
	return 0
}

// warmup notes the published count and the time once a fifth of the run
// has gone by.
type warmup struct {
	at        time.Time
	published int64
	done      chan struct{}
}

func watchWarmup(cl *Client, sc Scenario, start time.Time, stop <-chan struct{}) *warmup {
	w := &warmup{done: make(chan struct{})}
	go func() {
		defer close(w.done)
		every(2*time.Millisecond, stop, func() bool {
			n := cl.published.Load()
			if (sc.Messages > 0 && n >= sc.Messages/5) || (sc.Messages == 0 && time.Since(start) >= sc.Duration/5) {
				w.at, w.published = time.Now(), n
				return false
			}
			return true
		})
	}()
	return w
}

// every calls fn each period until stop is closed or fn returns false.
func every(period time.Duration, stop <-chan struct{}, fn func() bool) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if !fn() {
			return
		}
	}
}
