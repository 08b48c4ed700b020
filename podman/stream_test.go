package podman

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
	"time"
)

func frame(stream byte, text string) []byte {
	b := make([]byte, 8, 8+len(text))
	b[0] = stream
	binary.BigEndian.PutUint32(b[4:], uint32(len(text)))
	return append(b, text...)
}

// The log stream's frames become lines with their time and stream; a line
// over MaxLogLine is cut (and read through, so the next one is whole);
// a partial line says so.
func TestReadLogFrames(t *testing.T) {
	var in bytes.Buffer
	in.Write(frame(1, "2026-12-01T20:00:01Z hello\n"))
	in.Write(frame(2, "2026-12-01T20:00:02+01:00 on stderr\n"))
	in.Write(frame(1, "2026-12-01T20:00:03Z "+strings.Repeat("x", 3*MaxLogLine)+"\n"))
	in.Write(frame(1, "2026-12-01T20:00:04Z no newline"))
	in.Write(frame(1, "not a time\n"))
	var got []LogLine
	if err := readLogFrames(&in, func(l LogLine) error { got = append(got, l); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 5 {
		t.Fatalf("%d lines: %+v", len(got), got)
	}
	if got[0].Text != "hello" || got[0].Stream != "stdout" || !got[0].Time.Equal(time.Date(2026, 12, 1, 20, 0, 1, 0, time.UTC)) {
		t.Fatalf("line 0: %+v", got[0])
	}
	if got[1].Stream != "stderr" || !got[1].Time.Equal(time.Date(2026, 12, 1, 19, 0, 2, 0, time.UTC)) {
		t.Fatalf("line 1: %+v", got[1])
	}
	if !got[2].Cut || len(got[2].Text) > MaxLogLine || got[2].Partial {
		t.Fatalf("long line: cut %v, %d bytes", got[2].Cut, len(got[2].Text))
	}
	if !got[3].Partial || got[3].Text != "no newline" {
		t.Fatalf("partial: %+v", got[3])
	}
	if got[4].Text != "not a time" || !got[4].Time.IsZero() {
		t.Fatalf("no time: %+v", got[4])
	}
}

// A damaged stream is an error, not a hang or a huge allocation.
func TestReadLogFramesDamaged(t *testing.T) {
	b := frame(9, "x")
	if err := readLogFrames(bytes.NewReader(b), func(LogLine) error { return nil }); err == nil {
		t.Fatal("an unknown stream was taken")
	}
	b = frame(1, "2026-12-01T20:00:01Z hello\n")
	binary.BigEndian.PutUint32(b[4:], 1<<31)
	if err := readLogFrames(bytes.NewReader(b), func(LogLine) error { return nil }); err == nil {
		t.Fatal("a frame longer than the stream was taken")
	}
}
