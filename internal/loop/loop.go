// Package loop holds the loops the recorder's background goroutines
// run: on a timer, woken early by an alarm, idle without work.
package loop

import "time"

// Alarm lets a worker that sleeps while idle be woken when work arrives.
type Alarm chan struct{}

// NewAlarm returns an alarm that holds one ring.
func NewAlarm() Alarm { return make(Alarm, 1) }

// Wake wakes the worker; it never blocks.
func (w Alarm) Wake() {
	select {
	case w <- struct{}{}:
	default:
	}
}

// EveryWhileBusy calls f every d while busy says there is work, and
// otherwise waits for w (or idle at most) before calling it again: a
// worker with nothing to do costs no wake-ups.
func EveryWhileBusy(d, idle time.Duration, w Alarm, stop <-chan struct{}, busy func() bool, f func(now time.Time)) {
	SleepLoop(d, w, stop, func(now time.Time) time.Duration {
		f(now)
		if busy() {
			return d
		}
		return idle
	})
}

// SleepLoop calls f when its timer fires or w rings (w may be nil) until
// stop is closed; f returns how long to sleep before the next call.
func SleepLoop(first time.Duration, w Alarm, stop <-chan struct{}, f func(now time.Time) time.Duration) {
	t := time.NewTimer(first)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-w:
		case <-t.C:
		}
		t.Reset(f(time.Now()))
	}
}

// Every calls f with the time every d until stop is closed.
func Every(d time.Duration, stop <-chan struct{}, f func(now time.Time)) {
	tick := time.NewTicker(d)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-tick.C:
			f(now)
		}
	}
}
