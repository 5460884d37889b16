package analysis

import "sort"

// CategoryResult is one category's blocked time.
type CategoryResult struct {
	Name        string  `json:"name"`
	Description string  `json:"description"`
	Ns          int64   `json:"ns"`       // all off-CPU time in the category
	AppNs       int64   `json:"app_ns"`   // of it, with an application frame
	Share       float64 `json:"share"`    // AppNs / app_blocked_ns
	FirstNs     int64   `json:"first_ns"` // app time whose first matching rule is this one
	Idle        bool    `json:"idle,omitempty"`
	// TopFunction: the innermost application function with the most of
	// this category's app time.
	TopFunction   string `json:"top_function,omitempty"`
	TopFunctionNs int64  `json:"top_function_ns,omitempty"`
}

// ProcessResult is one process's time (by process name).
type ProcessResult struct {
	Name         string `json:"name"`
	OffCPUNs     int64  `json:"offcpu_ns"`
	AppBlockedNs int64  `json:"app_blocked_ns"`
	IdleNs       int64  `json:"idle_ns"`
	RunQueueNs   int64  `json:"runqueue_ns"`
	CPUNs        int64  `json:"cpu_ns,omitempty"`
}

// GroupResult is one thread group (names with digits collapsed).
type GroupResult struct {
	Name         string           `json:"name"`
	OffCPUNs     int64            `json:"offcpu_ns"`
	AppBlockedNs int64            `json:"app_blocked_ns"`
	RunQueueNs   int64            `json:"runqueue_ns"` // of OffCPUNs, waiting for a CPU
	CPUNs        int64            `json:"cpu_ns,omitempty"`
	Categories   map[string]int64 `json:"categories"` // app ns per category
}

// TargetWakeups are the wake-ups of one woken thread group.
type TargetWakeups struct {
	Group   string           `json:"group"`
	Total   int64            `json:"total"`
	ByClass map[string]int64 `json:"by_class"`
}

// WakeupResult summarizes wake-ups.
type WakeupResult struct {
	Total           int64            `json:"total"`
	ByClass         map[string]int64 `json:"by_class"`
	ByWakerFunction []Count          `json:"by_waker_function"`
	ByTargetGroup   []TargetWakeups  `json:"by_target_group"`
	// ByPair counts wake-ups by "waker group → woken group".
	ByPair            map[string]int64 `json:"by_pair"`
	PerMessage        float64          `json:"per_message,omitempty"`
	EventfdPerMessage float64          `json:"eventfd_per_message,omitempty"`
}

// BlockedOn is blocked time with an application frame by what ended it:
// the waiting threads' group and first category, and the waker's group
// (or the interrupt and its class) with its innermost named application
// frame.
type BlockedOn struct {
	Waiters       string `json:"waiters"`
	Category      string `json:"category"`
	Waker         string `json:"waker"`
	WakerFunction string `json:"waker_function,omitempty"`
	Ns            int64  `json:"ns"`
}

// TopStack is one of the stacks with the most app-blocked time.
type TopStack struct {
	Thread     string   `json:"thread"`
	Ns         int64    `json:"ns"`
	Categories []string `json:"categories"`
	Stack      string   `json:"stack"` // folded, root first
}

// Report is what offcpu analyze prints.
type Report struct {
	Sources      []string `json:"sources"`
	ThreadFilter string   `json:"thread_filter,omitempty"`
	// ProcessFilter says which processes were analyzed, where not all.
	ProcessFilter string          `json:"process_filter,omitempty"`
	Processes     []ProcessResult `json:"processes,omitempty"`
	TotalOffCPUNs int64           `json:"total_offcpu_ns"`
	// RunQueueNs: of TotalOffCPUNs, waiting for a CPU (woken and not yet
	// running, or preempted): never blocked time.
	RunQueueNs   int64 `json:"runqueue_ns"`
	AppBlockedNs int64 `json:"app_blocked_ns"`
	// IdleNs is off-CPU time whose first matching category is idle
	// (IdleCategories): waiting for work, never counted as blocked.
	IdleNs         int64    `json:"idle_ns"`
	IdleCategories []string `json:"idle_categories"`
	CPUNs          int64    `json:"cpu_ns"`
	// Off-CPU time with a user stack, and the part whose user stack
	// reaches a thread start (clone3, start_thread, runtime.goexit...):
	// how much of the picture the stacks show whole.
	UserStackNs     int64            `json:"user_stack_ns"`
	WholeStackNs    int64            `json:"whole_user_stack_ns"`
	Categories      []CategoryResult `json:"categories"`
	ThreadGroups    []GroupResult    `json:"thread_groups"`
	Wakeups         WakeupResult     `json:"wakeups"`
	TopStacks       []TopStack       `json:"top_stacks"`
	TopAppFunctions []Count          `json:"top_app_functions"` // innermost app frame, app-blocked ns
	FunctionsCum    map[string]int64 `json:"-"`                 // app-blocked ns per function anywhere in the stack
	FunctionsFlat   map[string]int64 `json:"-"`                 // per innermost app frame
	WakerFunctions  map[string]int64 `json:"-"`
	Messages        int64            `json:"messages,omitempty"`
	// Goroutines: the stacks are goroutine waits (a goroutine profile);
	// groups are goroutines' start functions.
	Goroutines bool     `json:"goroutines,omitempty"`
	Statements []string `json:"statements"`
	// UnmatchedRules: rules of a user's rules file that matched nothing
	// (file:line and category), most often a misspelled pattern.
	UnmatchedRules []string `json:"unmatched_rules,omitempty"`
	// BlockedOn: what ended the blocked time, largest first (top entries).
	BlockedOn []BlockedOn `json:"blocked_on,omitempty"`
	// Chains: the blocked time followed along its wakers' own waits to
	// its root causes, largest first (top entries).
	Chains []RootCause `json:"chains,omitempty"`
	// Intervals: with a continuous recording's directory, each
	// interval's figures (the report merges them).
	Intervals []IntervalFigures `json:"intervals,omitempty"`
}

// Count is a name with a count or a time.
type Count struct {
	Name  string `json:"name"`
	Value int64  `json:"value"`
}

// TopCounts returns the n largest values of m, largest first (ties by name).
func TopCounts(m map[string]int64, n int) []Count {
	var out []Count
	for k, v := range m {
		out = append(out, Count{k, v})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Value != out[j].Value {
			return out[i].Value > out[j].Value
		}
		return out[i].Name < out[j].Name
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}
