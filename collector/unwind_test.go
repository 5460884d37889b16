package collector

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/internal/testenv"
	"github.com/offcpu/offcpu/schema"
)

// chains are the blocker's threads: the functions each must show, outermost
// first, from the thread start down to the libc call.
var blockerChains = map[string][]string{
	"cond":  {"start_thread", "run_cond", "cond_a", "cond_b", "cond_c", "pthread_cond_wait"},
	"sleep": {"start_thread", "run_sleep", "sleep_a", "sleep_b", "sleep_c", "nanosleep"},
	"read":  {"start_thread", "run_read", "read_a", "read_b", "read_c", "read"},
	// arm64 has no epoll_wait system call: glibc's tail-calls epoll_pwait.
	"epoll": {"start_thread", "run_epoll", "epoll_a", "epoll_b", "epoll_c", "epoll_wait|epoll_pwait"},
}

// userFuncs returns a sample's user function names, outermost first.
func userFuncs(s *profile.Sample) []string {
	var out []string
	for i := len(s.Location) - 1; i >= 0; i-- {
		l := s.Location[i]
		if l.Mapping != nil && l.Mapping.File == schema.KernelMapping {
			break
		}
		for j := len(l.Line) - 1; j >= 0; j-- {
			if f := l.Line[j].Function; f != nil {
				out = append(out, f.Name)
			}
		}
	}
	return out
}

// libc names its entry points with prefixes (__GI___nanosleep,
// __libc_read, __pthread_cond_wait...): match base names. A want ending
// in * matches as a prefix.
// sameFunc: want may end in "*" (a prefix) or list names by "|".
func sameFunc(got, want string) bool {
	if alts := strings.Split(want, "|"); len(alts) > 1 {
		for _, a := range alts {
			if sameFunc(got, a) {
				return true
			}
		}
		return false
	}
	base := func(s string) string {
		return strings.TrimLeft(strings.TrimPrefix(strings.TrimPrefix(s, "__GI_"), "__libc_"), "_")
	}
	if p, ok := strings.CutSuffix(want, "*"); ok {
		return strings.HasPrefix(base(got), base(p))
	}
	return base(got) == base(want)
}

// inOrder reports whether funcs holds each of want, in that order (other
// frames may come between).
func inOrder(funcs, want []string) bool {
	i := 0
	for _, f := range funcs {
		if i < len(want) && sameFunc(f, want[i]) {
			i++
		}
	}
	return i == len(want)
}

// hasChain reports whether funcs holds want in order, each next one the
// very next frame except inside libc (where wrappers may nest).
func hasChain(funcs, want []string) bool {
	i := 0
	for _, f := range funcs {
		if i < len(want) && sameFunc(f, want[i]) {
			i++
			continue
		}
		if i > 0 && i < len(want)-1 {
			return false // a frame missing between two of the program's functions
		}
	}
	return i == len(want)
}

func buildBlocker(t testing.TB, flags ...string) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil && os.Getenv(testenv.EnvPrebuilt) == "" {
		t.Fatal("gcc not found: apt-get install gcc")
	}
	bin := filepath.Join(t.TempDir(), "blocker")
	args := append([]string{"-O2", "-g0", "-pthread", "-o", bin, "testdata/unwind/blocker.c"}, flags...)
	runBuild(t, "gcc", args...)
	return bin
}

// blockedChains records the blocker and returns, per thread kind, the
// off-CPU time under the whole chain and in all.
func recordBlocker(t *testing.T, bin string, opts Options, byPID bool) (whole, all map[string]int64, _ *profile.Profile, _ *Session) {
	t.Helper()
	cmd := exec.Command(bin, "1500")
	if byPID {
		cmd.Args = append(cmd.Args, "signal") // start once attached
	}
	cmd.Stderr = os.Stderr
	p, s := recordCommand(t, opts, cmd, byPID, byPID)
	whole, all = map[string]int64{}, map[string]int64{}
	for _, smp := range p.Sample {
		funcs := userFuncs(smp)
		for kind, chain := range blockerChains {
			if containsFunc(funcs, chain[1]) {
				all[kind] += smp.Value[0]
				if hasChain(funcs, chain) {
					whole[kind] += smp.Value[0]
				}
			}
		}
	}
	return whole, all, p, s
}

func containsFunc(funcs []string, name string) bool {
	for _, f := range funcs {
		if f == name {
			return true
		}
	}
	return false
}

func TestUnwindWithoutFramePointers(t *testing.T) {
	requireBPF(t)
	for _, tc := range []struct {
		name  string
		flags []string
		byPID bool
		min   float64 // share of off-CPU time with whole stacks
		tp    bool
	}{
		{"omit-frame-pointer/pid", []string{"-fomit-frame-pointer"}, true, 0.95, false},
		// A started command's first sleeps may precede the loading of its
		// libraries' tables (a few ms after the loader maps them).
		{"omit-frame-pointer/command", []string{"-fomit-frame-pointer"}, false, 0.95, false},
		{"frame-pointer/pid", []string{"-fno-omit-frame-pointer"}, true, 0.95, false},
		{"omit-frame-pointer/tracepoint", []string{"-fomit-frame-pointer"}, true, 0.95, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin := buildBlocker(t, tc.flags...)
			whole, all, p, s := recordBlocker(t, bin, Options{NoWakeups: true, ForceTracepoint: tc.tp}, tc.byPID)
			st := s.Stats()
			if want := map[bool]string{true: "tracepoint", false: "tp_btf"}[tc.tp]; st.Attach != want {
				t.Fatalf("attached with %s, want %s", st.Attach, want)
			}
			for kind, chain := range blockerChains {
				if all[kind] == 0 {
					t.Errorf("%s thread: no off-CPU time recorded under %s", kind, chain[1])
					continue
				}
				if share := float64(whole[kind]) / float64(all[kind]); share < tc.min {
					t.Errorf("%s thread: %.1f%% of its off-CPU time has the whole chain %v", kind, 100*share, chain)
					for _, smp := range p.Sample {
						if f := userFuncs(smp); containsFunc(f, chain[1]) && !hasChain(f, chain) {
							t.Logf("  partial: %v", f)
						}
					}
				}
			}
			if st.Unwind == nil || st.Unwind.Files == 0 || st.Unwind.Stacks == 0 {
				t.Errorf("no unwind tables used: %+v", st.Unwind)
			}
			if share := st.CompleteShare(); share < tc.min {
				t.Errorf("user stacks reaching a thread start: %.1f%% of off-CPU time, want at least %.0f%%", 100*share, 100*tc.min)
				for _, smp := range p.Sample {
					if f := userFuncs(smp); len(f) > 0 && !schema.IsThreadStart(f[0]) {
						t.Logf("  truncated (%v, %v): %s", time.Duration(smp.Value[0]), smp.Label, schema.FoldedSample(smp))
					}
				}
			}
			t.Logf("complete %.1f%% (%d stacks complete, %d truncated); tables: %+v", 100*st.CompleteShare(), st.CompleteStacks, st.TruncatedStacks, *st.Unwind)
		})
	}
}

// A waker in libc is walked whole too: the blocker's main thread wakes
// the cond thread through pthread_cond_signal.
func TestUnwindWakerStacks(t *testing.T) {
	requireBPF(t)
	bin := buildBlocker(t, "-fomit-frame-pointer")
	_, _, _, s := recordBlocker(t, bin, Options{}, true)
	wp := s.Profiles().Wakeups
	if wp == nil {
		t.Fatal("no wake-up profile")
	}
	// Static glibc names its start __libc_start_main_impl.
	want := []string{"_start", "__libc_start_main*", "main", "pthread_cond_signal"}
	var whole, all int64
	for _, smp := range wp.Sample {
		f := userFuncs(smp)
		if !containsFunc(f, "main") || !strings.Contains(strings.Join(f, ";"), "pthread_cond_signal") {
			continue
		}
		all += smp.Value[0]
		if inOrder(f, want) {
			whole += smp.Value[0]
		} else {
			t.Logf("partial: %v", f)
		}
	}
	if all == 0 {
		t.Fatal("no wake-up from pthread_cond_signal under main")
	}
	if whole*100 < all*95 {
		t.Errorf("%d of %d wake-ups from pthread_cond_signal have the whole waker stack %v", whole, all, want)
	}
}

// The on-CPU sampler walks C code without frame pointers whole too.
func TestUnwindCPUSamples(t *testing.T) {
	requireBPF(t)
	bin := filepath.Join(t.TempDir(), "spin")
	runBuild(t, "gcc", "-O2", "-fomit-frame-pointer", "-o", bin, "testdata/unwind/spin.c")
	p, _ := recordCommand(t, Options{NoWakeups: true, CPUHz: 499}, exec.Command(bin, "100000"))
	want := []string{"_start", "__libc_start_main", "main", "spin_a", "spin_b", "spin_c"}
	var whole, all int64
	for _, smp := range p.Sample {
		if smp.Label[schema.LabelState][0] != "on-cpu" || !containsFunc(userFuncs(smp), "spin_c") {
			continue
		}
		all += smp.Value[2]
		if inOrder(userFuncs(smp), want) {
			whole += smp.Value[2]
		}
	}
	if all == 0 {
		t.Fatal("no on-CPU sample in spin_c")
	}
	if whole*100 < all*90 {
		t.Errorf("%.1f%% of on-CPU time in spin_c has the whole stack %v", 100*float64(whole)/float64(all), want)
	}
}

// Frame pointers alone lose the program's frames under libc: the test
// above would fail without the tables.
func TestFramePointersOnlyTruncates(t *testing.T) {
	requireBPF(t)
	bin := buildBlocker(t, "-fomit-frame-pointer")
	whole, all, _, s := recordBlocker(t, bin, Options{NoWakeups: true, FramePointersOnly: true}, true)
	st := s.Stats()
	for kind, chain := range blockerChains {
		if whole[kind] != 0 {
			t.Errorf("%s thread: whole chain %v found with frame pointers only (%d of %d ns)", kind, chain, whole[kind], all[kind])
		}
	}
	if st.Unwind != nil {
		t.Errorf("unwind stats present with FramePointersOnly: %+v", st.Unwind)
	}
	// On arm64 libc's frame records chain over the program's frames to
	// the thread's start: its frames are lost, its start is not.
	if share := st.CompleteShare(); share > 0.5 && runtime.GOARCH == "amd64" {
		t.Errorf("frame pointers alone reached the thread start for %.1f%% of off-CPU time", 100*share)
	}
}
