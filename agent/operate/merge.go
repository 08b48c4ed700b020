package operate

import (
	"context"
	"mesh/cluster/api"
	"reflect"
	"time"
)

// merge writes the records of several sources, each in time order, as one
// stream in time order: it holds one record per source and writes the
// earliest. A record with no time (a note, an error) goes first.
//
// wait < 0: every source ends (logs without -f), and the merge waits for
// each. wait >= 0 (following): a source with nothing for that long does not
// hold the others back. flush is called whenever the merge is about to
// block.
func merge(ctx context.Context, srcs []<-chan api.Record, wait time.Duration, write func(api.Record) error, flush func()) {
	heads := make([]*api.Record, len(srcs))
	open, idle := make([]bool, len(srcs)), make([]bool, len(srcs))
	for i := range open {
		open[i] = true
	}
	for {
		if !fill(ctx, srcs, heads, open, idle, wait, flush) {
			return
		}
		best := -1
		for i, h := range heads {
			if h != nil && (best < 0 || before(*h, *heads[best])) {
				best = i
			}
		}
		if best < 0 {
			done := true
			for _, o := range open {
				done = done && !o
			}
			if done {
				flush()
				return
			}
			continue
		}
		if write(*heads[best]) != nil {
			return
		}
		heads[best] = nil
	}
}

func before(a, b api.Record) bool {
	if a.Time.IsZero() || b.Time.IsZero() {
		return a.Time.IsZero() && !b.Time.IsZero()
	}
	return a.Time.Before(b.Time)
}

// fill takes a record from each open source that has none held: from
// all of them (wait < 0); following, from those not found idle, for at
// most wait once one record is held: a source that had nothing within it is
// idle (not waited for) until it sends again. It reports false when ctx
// ended.
func fill(ctx context.Context, srcs []<-chan api.Record, heads []*api.Record, open, idle []bool, wait time.Duration, flush func()) bool {
	held := 0
	for i, ch := range srcs {
		if heads[i] != nil {
			held++
			continue
		}
		if !open[i] {
			continue
		}
		select {
		case r, ok := <-ch:
			if !ok {
				open[i] = false
				continue
			}
			heads[i], idle[i] = &r, false
			held++
		default:
		}
	}
	var timer <-chan time.Time
	flushed := false
	for {
		var cases []reflect.SelectCase
		var idx []int
		for i, ch := range srcs {
			if heads[i] == nil && open[i] && (!idle[i] || held == 0) {
				cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ch)})
				idx = append(idx, i)
			}
		}
		if len(cases) == 0 {
			return true
		}
		if wait >= 0 && held > 0 {
			if timer == nil {
				timer = time.After(wait)
			}
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(timer)})
		}
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())})
		if !flushed {
			flush()
			flushed = true
		}
		chosen, v, ok := reflect.Select(cases)
		switch {
		case chosen == len(cases)-1: // ctx
			return false
		case chosen >= len(idx): // the wait is over: who had nothing is idle
			for _, i := range idx {
				idle[i] = true
			}
			return true
		case !ok:
			open[idx[chosen]] = false
		default:
			r := v.Interface().(api.Record)
			heads[idx[chosen]], idle[idx[chosen]] = &r, false
			held++
		}
	}
}
