package manifest

import (
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// MinScheduleEvery is the shortest `every` a step's schedule takes.
const MinScheduleEvery = 10 * time.Second

// Schedule is when a scheduled step runs again (issue 30, item 3).
type Schedule interface {
	// Next is the first slot after t.
	Next(t time.Time) time.Time
}

// ParseSchedule parses a step's schedule: daily, hourly, weekly, "every
// DURATION" (at least 10s), or a cron line of five fields (minute hour
// day-of-month month day-of-week), in UTC.
func ParseSchedule(s string) (Schedule, error) {
	switch s {
	case "daily":
		s = "@daily"
	case "hourly":
		s = "@hourly"
	case "weekly":
		s = "@weekly"
	}
	if d, ok := strings.CutPrefix(s, "every "); ok {
		v, err := time.ParseDuration(strings.TrimSpace(d))
		if err != nil || v < MinScheduleEvery || v > 366*24*time.Hour {
			return nil, fmt.Errorf("schedule %q: write every DURATION between 10s and 366 days (every 15m, every 6h)", s)
		}
		return cron.Every(v), nil
	}
	if strings.HasPrefix(s, "@every") || strings.HasPrefix(s, "TZ=") || strings.HasPrefix(s, "CRON_TZ=") {
		return nil, fmt.Errorf("schedule %q: write daily, hourly, weekly, every DURATION, or a cron line of five fields (in UTC)", s)
	}
	sch, err := cron.ParseStandard(s)
	if err != nil {
		return nil, fmt.Errorf("schedule %q: %v; write daily, hourly, weekly, every DURATION, or a cron line of five fields (minute hour day month weekday, in UTC)", s, err)
	}
	// A line no date matches (30 2: February 30th) has no slot ever; from
	// a fixed day, so that every node's check agrees.
	if sch.Next(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)).IsZero() {
		return nil, fmt.Errorf("schedule %q: no day matches it, so it would never run", s)
	}
	return utc{sch}, nil
}

// utc reads a cron line in UTC, the same on every node.
type utc struct{ cron.Schedule }

func (u utc) Next(t time.Time) time.Time { return u.Schedule.Next(t.UTC()) }
