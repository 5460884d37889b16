package analysis

import (
	"hash/maphash"
	"regexp"
	"sync"
)

// The rules' caches: the same stacks and frames meet the same rules again
// and again, and running the regexps was most of an analysis's time.

// Categorize returns every category whose rule matches, in rule order,
// or ["other"]. Then the waker has its say: the first verdict that matches
// an off-CPU stack's waker comes first where it disagrees with the rules'
// first category on whether the wait was idle (or that category is
// "other"): a lock wait that sleeps in epoll_wait, woken by another
// thread's release, is blocked; a socket read woken by another program is
// idle.
func (r *Rules) Categorize(s *Stack) []string {
	k := ruleKey(s)
	if out, ok := r.cats.get(k); ok {
		return out
	}
	out := r.categorize(s)
	r.cats.put(k, out)
	return out
}

// ruleKey is a 128-bit hash of all that rules and verdicts read of a
// stack, written straight into the hashes (no string is built: a deep
// stack's frames are most of an analysis's allocations otherwise).
func ruleKey(s *Stack) [2]uint64 {
	var h [2]maphash.Hash
	h[0].SetSeed(hashSeeds[0])
	h[1].SetSeed(hashSeeds[1])
	str := func(v string, end byte) {
		for i := range h {
			h[i].WriteString(v)
			h[i].WriteByte(end)
		}
	}
	for _, f := range []string{s.Kind, s.Thread, s.State, s.Reason, s.WakerRelation(), s.Class, s.InRequestWhy, s.Loop} {
		str(f, 0)
	}
	flags := ""
	for _, f := range []struct {
		on bool
		c  string
	}{{s.InRequest, "r"}, {s.WakerDispatching, "d"}, {s.InTrace(), "t"}, {s.WakerPassedOn, "p"}} {
		if f.on {
			flags += f.c
		}
	}
	str(flags, 2)
	for _, fr := range [][]Frame{s.Frames, {{Name: "|"}}, s.WakerFrames} {
		for _, f := range fr {
			str(f.Name, 0)
			if f.Kernel {
				str(f.Module, 'k')
			} else {
				str(f.Module, 1)
			}
		}
	}
	return [2]uint64{h[0].Sum64(), h[1].Sum64()}
}

// frameMatches: re matches the name (h: hash128(name)) as written or
// normalised. Results
// are cached: the same few thousand names meet the same rules in every
// stack, and running the regexps was most of an analysis's time.
func frameMatches(re *regexp.Regexp, name string, h [2]uint64) bool {
	k := matchKey{re, h}
	if v, ok := matches.get(k); ok {
		return v
	}
	norm := NormalizeFrame(name)
	m := re.MatchString(name) || (norm != name && re.MatchString(norm))
	matches.put(k, m)
	return m
}

// matchKey holds a hash of the name, not the name: a cache that pinned
// every name it saw grew by megabytes an hour in an agent.
type matchKey struct {
	re   *regexp.Regexp
	name [2]uint64
}

const maxMatchCache = 1 << 17 // a few MB: an agent runs for months

var (
	matches   hashCache[matchKey, bool]
	hashSeeds = [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}
)

// hashCache is a concurrent map emptied when it reaches maxMatchCache
// entries: bounded for long-lived users who see ever new names.
type hashCache[K comparable, V any] struct {
	mu sync.RWMutex
	m  map[K]V
}

func (c *hashCache[K, V]) get(k K) (V, bool) {
	c.mu.RLock()
	v, ok := c.m[k]
	c.mu.RUnlock()
	return v, ok
}

func (c *hashCache[K, V]) put(k K, v V) {
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxMatchCache {
		c.m = map[K]V{}
	}
	c.m[k] = v
	c.mu.Unlock()
}

// hash128 is the 128-bit hash of the strings ss: a cache key that keeps
// no copy of them.
func hash128(ss ...string) [2]uint64 {
	var out [2]uint64
	for i, seed := range hashSeeds {
		var h maphash.Hash
		h.SetSeed(seed)
		for _, s := range ss {
			h.WriteString(s)
			h.WriteByte(0)
		}
		out[i] = h.Sum64()
	}
	return out
}

// IsApp reports whether a frame is application code.
func (r *Rules) IsApp(f Frame) bool {
	if f.Kernel {
		return false
	}
	k := hash128(f.Name, f.Module)
	if v, ok := r.apps.get(k); ok {
		return v
	}
	v := r.isApp(f)
	r.apps.put(k, v)
	return v
}

// isApp is IsApp without the cache: a user frame whose module and name no
// not-application pattern matches.
func (r *Rules) isApp(f Frame) bool {
	if f.Module != "" {
		for _, re := range r.notModules {
			if re.MatchString(f.Module) {
				return false
			}
		}
	}
	for _, re := range r.notApp {
		if re.MatchString(f.Name) {
			return false
		}
	}
	return true
}
