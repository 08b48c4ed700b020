package operate

import (
	"context"
	"fmt"
	"mesh/cluster/api"
	"testing"
	"time"
)

func feed(recs ...api.Record) <-chan api.Record {
	ch := make(chan api.Record, len(recs))
	for _, r := range recs {
		ch <- r
	}
	close(ch)
	return ch
}

func at(s int, text string) api.Record {
	return api.Record{Time: time.Unix(int64(s), 0), Text: text}
}

// Lines of several sources come out in time order, each source's own order
// kept among equal times, notes first.
func TestMergeInTimeOrder(t *testing.T) {
	a := feed(at(1, "a1"), at(3, "a3"), at(3, "a3b"), at(7, "a7"))
	b := feed(api.Record{Note: "b replaced"}, at(2, "b2"), at(3, "b3"), at(9, "b9"))
	c := feed()
	var got []string
	merge(context.Background(), []<-chan api.Record{a, b, c}, -1, func(r api.Record) error {
		got = append(got, r.Text+r.Note)
		return nil
	}, func() {})
	want := "[b replaced a1 b2 a3 a3b b3 a7 b9]"
	if fmt.Sprint(got) != want {
		t.Fatalf("merged %v, want %s", got, want)
	}
}

// Following, a source with nothing to say does not hold the others back:
// a line of a busy source comes out while the quiet one stays open.
func TestMergeFollowQuietSource(t *testing.T) {
	busy, idle := make(chan api.Record, 4), make(chan api.Record)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := make(chan string, 10)
	go merge(ctx, []<-chan api.Record{busy, idle}, 20*time.Millisecond, func(r api.Record) error {
		out <- r.Text
		return nil
	}, func() {})
	for i := range 3 {
		busy <- at(i, fmt.Sprint("busy", i))
	}
	for i := range 3 {
		select {
		case s := <-out:
			if s != fmt.Sprint("busy", i) {
				t.Fatalf("got %s, want busy%d", s, i)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a quiet source held the busy one's lines back")
		}
	}
	idle <- at(10, "late")
	select {
	case s := <-out:
		if s != "late" {
			t.Fatalf("got %s", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the quiet source's line never came out")
	}
	cancel()
}
