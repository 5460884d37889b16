package analysis

import (
	"hash/maphash"
	"regexp"
	"strings"
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
	k := hash128(ruleInput(s))
	r.catMu.RLock()
	out, ok := r.cats[k]
	r.catMu.RUnlock()
	if ok {
		return out
	}
	out = r.categorize(s)
	r.catMu.Lock()
	if r.cats == nil || len(r.cats) >= maxMatchCache {
		r.cats = map[[2]uint64][]string{} // bounded, as matchCache
	}
	r.cats[k] = out
	r.catMu.Unlock()
	return out
}

// ruleInput is all that rules and verdicts read of a stack.
func ruleInput(s *Stack) string {
	var b strings.Builder
	for _, f := range []string{s.Kind, s.Thread, s.State, s.Reason, s.WakerRelation(), s.Class, s.InRequestWhy} {
		b.WriteString(f)
		b.WriteByte(0)
	}
	if s.InRequest {
		b.WriteByte('r')
	}
	if s.WakerDispatching {
		b.WriteByte('d')
	}
	if s.InTrace() {
		b.WriteByte('t')
	}
	if s.WakerPassedOn {
		b.WriteByte('p')
	}
	for _, fr := range [][]Frame{s.Frames, {{Name: "|"}}, s.WakerFrames} {
		for _, f := range fr {
			b.WriteString(f.Name)
			b.WriteByte(0)
			b.WriteString(f.Module)
			if f.Kernel {
				b.WriteByte('k')
			}
			b.WriteByte(1)
		}
	}
	return b.String()
}

// frameMatches: re matches the name (h: hash128(name)) as written or
// normalised. Results
// are cached: the same few thousand names meet the same rules in every
// stack, and running the regexps was most of an analysis's time.
func frameMatches(re *regexp.Regexp, name string, h [2]uint64) bool {
	k := matchKey{re, h}
	matchMu.RLock()
	v, ok := matchCache[k]
	matchMu.RUnlock()
	if ok {
		return v
	}
	norm := NormalizeFrame(name)
	m := re.MatchString(name) || (norm != name && re.MatchString(norm))
	matchMu.Lock()
	if len(matchCache) >= maxMatchCache {
		clear(matchCache) // bounded: long-lived users see ever new names
	}
	matchCache[k] = m
	matchMu.Unlock()
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
	matchMu    sync.RWMutex
	matchCache = map[matchKey]bool{}
	hashSeeds  = [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}
)

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
	r.appMu.RLock()
	v, ok := r.apps[k]
	r.appMu.RUnlock()
	if ok {
		return v
	}
	v = r.isApp(f)
	r.appMu.Lock()
	if r.apps == nil || len(r.apps) >= maxMatchCache {
		r.apps = map[[2]uint64]bool{} // bounded, as matchCache
	}
	r.apps[k] = v
	r.appMu.Unlock()
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
