package schema

import (
	"strings"
)

// ThreadGroup collapses a thread name's counters: broker-io-3 →
// broker-io-N. A counter is a run of digits after a separator (broker-io-3,
// GC Thread#0, pool-2-thread-7) or ending a word that has no other digit
// (worker12); digits inside a word stay (C2 CompilerThre, offcpu-f2d2371).
func ThreadGroup(name string) string {
	if name == "" {
		return "[unnamed]"
	}
	var b strings.Builder
	word := 0 // start of the current word
	for i := 0; i < len(name); {
		if !isDigit(name[i]) {
			if strings.IndexByte(threadSeparators, name[i]) >= 0 {
				word = i + 1
			}
			b.WriteByte(name[i])
			i++
			continue
		}
		j := i
		for j < len(name) && isDigit(name[j]) {
			j++
		}
		ends := j == len(name) || strings.IndexByte(threadSeparators, name[j]) >= 0
		if (i == word && ends) || (j == len(name) && !strings.ContainsAny(name[word:i], "0123456789")) {
			b.WriteByte('N')
		} else {
			b.WriteString(name[i:j])
		}
		i = j
	}
	return b.String()
}

// ShortFunc drops a Go import path: github.com/x/y/pkg.(*T).m → pkg.(*T).m.
// Bracketed names (a thread such as [ksoftirqd/1], a marker) stay whole.
func ShortFunc(name string) string {
	if strings.HasPrefix(name, "[") {
		return name
	}
	if i := strings.LastIndexByte(name, '/'); i >= 0 && !strings.ContainsAny(name[:i], " <") {
		return name[i+1:]
	}
	return name
}

const threadSeparators = "-#_/:. "

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
