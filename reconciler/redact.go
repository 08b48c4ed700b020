package reconciler

import (
	"slices"
	"strings"
	"sync"
)

// A container's output reaches the replicated state: a failed step's last
// lines, a health check's output and a container's last lines at its exit
// are in the node's report, which every node keeps and mesh status shows.
// A container that prints its configuration at start (a database URL with
// its password) would give a module's secret to nodes the secret is not
// sealed to. So the reconciler remembers the values it delivered to each
// module (operator secrets, credentials; in memory only) and takes them
// out of those texts.

// secretValues are, per module, the secret values the reconciler gave it.
type secretValues struct {
	mu sync.Mutex
	of map[string][]string // module -> values, longest first
}

const (
	// minRedacted: a shorter value is not looked for (it would take every
	// "1" or "on" out of the text and hides little).
	minRedacted = 4
	// maxRedactedPerModule bounds what is remembered (those given last
	// stay): a provider is given every consumer's credential at each
	// apply, and 64 let the first of 65 consumers' go at every pass.
	maxRedactedPerModule = 1024
)

// redactedMark is what a value is replaced with.
const redactedMark = "[secret]"

// add remembers value as one of module's, and the value without the
// white space around it: a file an editor saved ends in a newline that a
// program reading it (a shell's $(< file)) drops before it prints it.
func (s *secretValues) add(module string, value []byte) {
	v := string(value)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.addLocked(module, v)
	if t := strings.TrimSpace(v); t != v {
		s.addLocked(module, t)
	}
}

func (s *secretValues) addLocked(module, v string) {
	if len(v) < minRedacted {
		return
	}
	if s.of == nil {
		s.of = map[string][]string{}
	}
	list := s.of[module]
	if i := slices.Index(list, v); i >= 0 {
		if i < len(list)-1 { // given again: the last to go
			list = append(slices.Delete(list, i, i+1), v)
			s.of[module] = list
		}
		return
	}
	if len(list) >= maxRedactedPerModule {
		list = list[1:]
	}
	list = append(slices.Clip(list), v)
	s.of[module] = list
}

// redact is text with every value of module's replaced by redactedMark
// (the longest first: a value that holds another goes whole).
func (s *secretValues) redact(module, text string) string {
	if s == nil || text == "" {
		return text
	}
	s.mu.Lock()
	values := slices.Clone(s.of[module])
	s.mu.Unlock()
	slices.SortFunc(values, func(a, b string) int { return len(b) - len(a) })
	for _, v := range values {
		if strings.Contains(text, v) {
			text = strings.ReplaceAll(text, v, redactedMark)
		}
	}
	return text
}
